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
  CUresult allocate(size_t bytes, void** out);
  CUresult free(void* pointer);
  CUresult registerRange(void* pointer, size_t bytes);
  CUresult unregisterRange(void* pointer);
  bool isPinned(const void* pointer, size_t bytes);

 private:
  struct Range {
    size_t bytes;
    bool allocated;  // by us (cuMemHostAlloc), as opposed to registered
  };
  // True when `bytes` more may be pinned (mutex_ held).
  bool withinPinnedLimit(size_t bytes) const;

  std::mutex mutex_;
  std::map<uintptr_t, Range> ranges_;
  uint64_t pinnedBytes_ = 0;  // allocated and registered
};

}  // namespace cudasim
