#include "host_memory.h"

#include <sys/mman.h>

#include <cstring>
#include <iterator>

#include "faults.h"

namespace cudasim {

namespace {
constexpr size_t kPage = 4096;
size_t wholePages(size_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }
}  // namespace

void HostMemory::warm(uint64_t bytes) {
  bytes = wholePages(bytes);
  if (bytes == 0) return;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                 -1, 0);
  if (p == MAP_FAILED) return;  // not warmed: allocations map their own memory, as without it
  for (size_t page = 0; page < bytes; page += kPage) static_cast<volatile char*>(p)[page] = 0;
  mprotect(p, bytes, PROT_NONE);  // nothing is allocated there yet
  std::lock_guard lock(mutex_);
  arenaFree_[reinterpret_cast<uintptr_t>(p)] = bytes;
}

CUresult HostMemory::allocate(size_t bytes, void** out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (bytes == 0) {
    *out = nullptr;
    return CUDA_SUCCESS;
  }
  if (faults().hostAlloc.fires()) return CUDA_ERROR_OUT_OF_MEMORY;
  // The pages are written without the lock: it is the one every copy takes (isPinned), and a
  // driver's copies from memory pinned earlier do not wait for another thread's pinning (a
  // background thread growing a pool of 400 MiB held every copy of the program up for 0.65 s).
  // The memory is counted against the limit first, and known to copies once it is ready.
  const size_t pages = wholePages(bytes);
  uintptr_t start = 0;
  {
    std::lock_guard lock(mutex_);
    if (!withinPinnedLimit(bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
    pinnedBytes_ += bytes;
    for (auto free = arenaFree_.begin(); free != arenaFree_.end(); ++free) {
      if (free->second < pages) continue;
      start = free->first;
      const size_t rest = free->second - pages;
      arenaFree_.erase(free);
      if (rest > 0) arenaFree_[start + pages] = rest;
      break;
    }
  }
  const bool fromArena = start != 0;
  if (fromArena) {
    // Fresh memory reads as zero, as an allocation's pages always have here.
    mprotect(reinterpret_cast<void*>(start), pages, PROT_READ | PROT_WRITE);
    std::memset(reinterpret_cast<void*>(start), 0, pages);
  } else {
    // Pinned memory is resident from the start, as page-locked memory is: the cost of its
    // pages is paid here, as cudaHostAlloc pays it, not by the first copies into it.
    // MAP_POPULATE is not always enough: in a virtual machine whose host backs guest memory
    // lazily, the first write to each page still costs some microseconds (a copy engine's time
    // tripled on the first use of a block), so each page is written once here too.
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
      std::lock_guard lock(mutex_);
      pinnedBytes_ -= bytes;
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (size_t page = 0; page < bytes; page += kPage) static_cast<volatile char*>(p)[page] = 0;
    start = reinterpret_cast<uintptr_t>(p);
  }
  std::lock_guard lock(mutex_);
  ranges_[start] = Range{bytes, true, fromArena};
  *out = reinterpret_cast<void*>(start);
  return CUDA_SUCCESS;
}

CUresult HostMemory::free(void* pointer) {
  if (pointer == nullptr) return CUDA_SUCCESS;
  std::lock_guard lock(mutex_);
  auto it = ranges_.find(reinterpret_cast<uintptr_t>(pointer));
  if (it == ranges_.end() || !it->second.allocated) return CUDA_ERROR_INVALID_VALUE;
  if (it->second.fromArena) {
    const size_t pages = wholePages(it->second.bytes);
    uintptr_t start = it->first;
    size_t span = pages;
    mprotect(pointer, pages, PROT_NONE);
    auto next = arenaFree_.lower_bound(start);
    if (next != arenaFree_.end() && next->first == start + span) {
      span += next->second;
      next = arenaFree_.erase(next);
    }
    if (next != arenaFree_.begin() && std::prev(next)->first + std::prev(next)->second == start) {
      std::prev(next)->second += span;
    } else {
      arenaFree_[start] = span;
    }
  } else {
    munmap(pointer, it->second.bytes);
  }
  pinnedBytes_ -= it->second.bytes;
  ranges_.erase(it);
  return CUDA_SUCCESS;
}

CUresult HostMemory::registerRange(void* pointer, size_t bytes) {
  if (pointer == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const auto start = reinterpret_cast<uintptr_t>(pointer);
  std::lock_guard lock(mutex_);
  auto next = ranges_.lower_bound(start);
  if (next != ranges_.end() && next->first < start + bytes)
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  if (next != ranges_.begin() && std::prev(next)->first + std::prev(next)->second.bytes > start)
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  if (!withinPinnedLimit(bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  ranges_[start] = Range{bytes, false};
  pinnedBytes_ += bytes;
  return CUDA_SUCCESS;
}

CUresult HostMemory::unregisterRange(void* pointer) {
  std::lock_guard lock(mutex_);
  auto it = ranges_.find(reinterpret_cast<uintptr_t>(pointer));
  if (it == ranges_.end() || it->second.allocated) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  pinnedBytes_ -= it->second.bytes;
  ranges_.erase(it);
  return CUDA_SUCCESS;
}

bool HostMemory::withinPinnedLimit(size_t bytes) const {
  // The system's limit on locked memory (an injected fault, faults.h); 0: none.
  const uint64_t limit = faults().pinnedLimit.load(std::memory_order_relaxed);
  return limit == 0 || (bytes <= limit && pinnedBytes_ <= limit - bytes);
}

bool HostMemory::isPinned(const void* pointer, size_t bytes) {
  const auto start = reinterpret_cast<uintptr_t>(pointer);
  std::lock_guard lock(mutex_);
  auto it = ranges_.upper_bound(start);
  if (it == ranges_.begin()) return false;
  --it;
  return start - it->first + bytes <= it->second.bytes;
}

}  // namespace cudasim
