// First-fit allocator of aligned ranges inside [base, base + size), with coalescing frees.
// Used for device virtual addresses and for offsets into the physical-memory file.
// Not thread-safe: DeviceMemory serialises all use.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace cudasim {

class RangeAllocator {
 public:
  RangeAllocator(uint64_t base, uint64_t size) { free_[base] = size; }

  // An aligned range of `size` bytes (alignment: a power of two), or nothing when full.
  std::optional<uint64_t> allocate(uint64_t size, uint64_t alignment) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      uint64_t start = (it->first + alignment - 1) & ~(alignment - 1);
      uint64_t end = it->first + it->second;
      if (start + size <= end && start >= it->first) {
        carve(it, start, size);
        return start;
      }
    }
    return std::nullopt;
  }

  // `size` bytes in as few aligned pieces as first fit gives, when no single range is free: for
  // physical memory, which a GPU maps page by page. Nothing (and nothing taken) when the free
  // ranges do not add up to `size`.
  std::vector<std::pair<uint64_t, uint64_t>> allocatePieces(uint64_t size, uint64_t alignment) {
    std::vector<std::pair<uint64_t, uint64_t>> pieces;
    uint64_t taken = 0;
    for (auto it = free_.begin(); it != free_.end() && taken < size;) {
      const uint64_t start = (it->first + alignment - 1) & ~(alignment - 1);
      const uint64_t end = it->first + it->second;
      const uint64_t usable = start < end ? (end - start) & ~(alignment - 1) : 0;
      if (usable == 0) {
        ++it;
        continue;
      }
      const uint64_t piece = std::min(usable, size - taken);
      auto next = std::next(it);
      carve(it, start, piece);
      pieces.emplace_back(start, piece);
      taken += piece;
      it = next;
    }
    if (taken < size) {
      for (const auto& [start, bytes] : pieces) release(start, bytes);
      pieces.clear();
    }
    return pieces;
  }

  // Takes exactly [start, start + size) if all of it is free.
  bool allocateAt(uint64_t start, uint64_t size) {
    auto it = free_.upper_bound(start);
    if (it == free_.begin()) return false;
    --it;
    if (start + size > it->first + it->second) return false;
    carve(it, start, size);
    return true;
  }

  void release(uint64_t start, uint64_t size) {
    auto next = free_.lower_bound(start);
    if (next != free_.end() && start + size == next->first) {
      size += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == start) {
        prev->second += size;
        return;
      }
    }
    free_[start] = size;
  }

 private:
  void carve(std::map<uint64_t, uint64_t>::iterator it, uint64_t start, uint64_t size) {
    uint64_t blockStart = it->first;
    uint64_t blockEnd = it->first + it->second;
    free_.erase(it);
    if (start > blockStart) free_[blockStart] = start - blockStart;
    if (start + size < blockEnd) free_[start + size] = blockEnd - (start + size);
  }

  std::map<uint64_t, uint64_t> free_;  // start -> size
};

}  // namespace cudasim
