// Which managed buffer, if any, an address falls in. Launch analysis asks this for every
// 8-byte value of every parameter, so the common "not a managed pointer" answer is one
// comparison against the span of all managed ranges, and the rest is a map lookup
// (O(log n) in the number of live buffers). Not thread-safe: the residency lock guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

namespace delta::shim {

class AddressMap {
 public:
  static constexpr uint32_t kNone = 0xffffffffu;

  void insert(uint64_t start, uint64_t bytes, uint32_t id) {
    ranges_[start] = Range{start + bytes, id};
    if (start < low_) low_ = start;
    if (start + bytes > high_) high_ = start + bytes;
  }
  void erase(uint64_t start) { ranges_.erase(start); }

  // The buffer whose range holds `address` (interior pointers included).
  uint32_t find(uint64_t address) const {
    if (address < low_ || address >= high_) return kNone;
    auto it = ranges_.upper_bound(address);
    if (it == ranges_.begin()) return kNone;
    --it;
    return address < it->second.end ? it->second.id : kNone;
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
  struct Range {
    uint64_t end;
    uint32_t id;
  };
  std::map<uint64_t, Range> ranges_;
  uint64_t low_ = UINT64_MAX;
  uint64_t high_ = 0;
};

}  // namespace delta::shim
