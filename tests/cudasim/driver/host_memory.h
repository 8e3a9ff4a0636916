// Page-locked ("pinned") host memory: what cuMemHostAlloc returns and what
// cuMemHostRegister registers. The driver needs to know it because copies behave
// differently: an async copy from pinned memory reads its source when it runs, one from
// pageable memory is staged at call time.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <mutex>

namespace cudasim {

class HostMemory {
 public:
  // Pins `bytes` once, at start, for cuMemHostAlloc to hand out (CUDASIM_WARM_HOST_MEMORY). A
  // new allocation must write every page here: on a virtual machine that backs guest memory
  // lazily that costs 3-12 us a page (384 MiB: about a second), some tens of times what a
  // driver takes to pin, and a program that pins while it runs (a shim growing its pool of
  // host memory) then measures this machine rather than the model. Allocations that fit come
  // from this arena, first fit, pages already written; what is freed goes back to it with its
  // access taken away (touching freed pinned memory still faults), and the rest is mapped anew.
  void warm(uint64_t bytes);
  CUresult allocate(size_t bytes, void** out);
  CUresult free(void* pointer);
  CUresult registerRange(void* pointer, size_t bytes);
  CUresult unregisterRange(void* pointer);
  bool isPinned(const void* pointer, size_t bytes);

 private:
  struct Range {
    size_t bytes;
    bool allocated;  // by us (cuMemHostAlloc), as opposed to registered
    bool fromArena = false;
  };
  // True when `bytes` more may be pinned (mutex_ held).
  bool withinPinnedLimit(size_t bytes) const;

  std::mutex mutex_;
  std::map<uintptr_t, Range> ranges_;
  uint64_t pinnedBytes_ = 0;  // allocated (or being allocated) and registered
  std::map<uintptr_t, size_t> arenaFree_;  // start -> bytes, of the warmed arena
};

}  // namespace cudasim
