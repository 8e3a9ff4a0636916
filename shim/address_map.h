// Which managed buffer, if any, an address falls in. Launch analysis asks this for every
// 8-byte value of every parameter, so it must be cheap whatever the number of buffers:
// - values outside the span of all managed ranges are rejected with two comparisons;
// - the rest are looked up in a radix table of granules: managed buffers are reserved
//   ranges aligned to the mapping granularity (2 MiB), so every granule belongs to at most
//   one buffer, and a lookup is a few loads, O(1) in the number of buffers.
// Range queries (copies, memsets) walk an ordered map, O(log n + k).
// Not thread-safe: the residency lock guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

namespace delta::shim {

class AddressMap {
 public:
  static constexpr uint32_t kNone = 0xffffffffu;

  // `granuleShift`: log2 of the alignment every inserted range's start has (21: 2 MiB).
  explicit AddressMap(unsigned granuleShift = 21) : shift_(granuleShift) {}

  // Ranges must not overlap. Ranges aligned to the granule (all managed buffers) get O(1)
  // lookups; a granule shared by several ranges falls back to the ordered map.
  void insert(uint64_t start, uint64_t bytes, uint32_t id) {
    if (bytes == 0) return;
    ranges_[start] = Range{start + bytes, id};
    if (start < low_) low_ = start;
    if (start + bytes > high_) high_ = start + bytes;
    refreshGranules(start, start + bytes);
  }

  void erase(uint64_t start) {
    auto it = ranges_.find(start);
    if (it == ranges_.end()) return;
    const uint64_t end = it->second.end;
    ranges_.erase(it);
    refreshGranules(start, end);
  }

  // The buffer whose range holds `address` (interior pointers included).
  uint32_t find(uint64_t address) const {
    if (address < low_ || address >= high_) return kNone;
    const uint64_t granule = address >> shift_;
    const Leaf* leaf = leafFor(granule >> kLeafBits);
    if (leaf == nullptr) return kNone;
    const Entry& entry = leaf->entries[granule & (kLeafSize - 1)];
    if (entry.id == kShared) return findInMap(address);
    return entry.id != kNone && address >= entry.start && address < entry.end ? entry.id : kNone;
  }

  // Calls f(id) for every buffer overlapping [address, address + bytes).
  template <class F>
  void forEachOverlapping(uint64_t address, uint64_t bytes, F&& f) const {
    if (bytes == 0 || address >= high_ || address + bytes <= low_) return;
    auto it = ranges_.upper_bound(address);
    if (it != ranges_.begin()) --it;
    for (; it != ranges_.end() && it->first < address + bytes; ++it)
      if (it->second.end > address) f(it->second.id);
  }

  size_t size() const { return ranges_.size(); }

 private:
  static constexpr unsigned kLeafBits = 11;  // 2048 granules: 4 GiB of addresses per leaf
  static constexpr uint64_t kLeafSize = uint64_t(1) << kLeafBits;
  static constexpr uint32_t kShared = 0xfffffffeu;  // several ranges in this granule
  struct Entry {
    uint32_t id = kNone;
    uint64_t start = 0;  // the owning range
    uint64_t end = 0;
  };
  struct Leaf {
    Entry entries[kLeafSize];
  };

  uint32_t findInMap(uint64_t address) const {
    auto it = ranges_.upper_bound(address);
    if (it == ranges_.begin()) return kNone;
    --it;
    return address < it->second.end ? it->second.id : kNone;
  }

  // Recomputes the granules of [start, end) from the ordered map.
  void refreshGranules(uint64_t start, uint64_t end) {
    for (uint64_t granule = start >> shift_; granule <= (end - 1) >> shift_; ++granule) {
      const uint64_t granuleStart = granule << shift_;
      const uint64_t granuleEnd = granuleStart + (uint64_t(1) << shift_);
      Entry entry;
      int owners = 0;
      auto it = ranges_.upper_bound(granuleStart);
      if (it != ranges_.begin()) --it;
      for (; it != ranges_.end() && it->first < granuleEnd && owners < 2; ++it) {
        if (it->second.end <= granuleStart) continue;
        entry = Entry{it->second.id, it->first, it->second.end};
        ++owners;
      }
      if (owners == 2) entry.id = kShared;
      Leaf* leaf = leafFor(granule >> kLeafBits, owners > 0);
      if (leaf != nullptr) leaf->entries[granule & (kLeafSize - 1)] = entry;
    }
  }
  struct Range {
    uint64_t end;
    uint32_t id;
  };

  const Leaf* leafFor(uint64_t key) const {
    // Few leaves in practice (device addresses are handed out densely): a short scan.
    for (const auto& [leafKey, leaf] : leaves_)
      if (leafKey == key) return leaf.get();
    return nullptr;
  }
  Leaf* leafFor(uint64_t key, bool create) {
    if (const Leaf* leaf = static_cast<const AddressMap*>(this)->leafFor(key))
      return const_cast<Leaf*>(leaf);
    if (!create) return nullptr;
    leaves_.emplace_back(key, std::make_unique<Leaf>());
    return leaves_.back().second.get();
  }

  const unsigned shift_;
  std::map<uint64_t, Range> ranges_;
  std::vector<std::pair<uint64_t, std::unique_ptr<Leaf>>> leaves_;
  uint64_t low_ = UINT64_MAX;
  uint64_t high_ = 0;
};

}  // namespace delta::shim
