// The allocation paths other than cudaMalloc/cuMemAlloc that the shim puts itself in front of:
// pitched allocations (cuMemAllocPitch, which cudaMallocPitch and cudaMalloc3D reach), and
// stream-ordered allocation (cuMemAllocAsync, cuMemAllocFromPoolAsync, cuMemFreeAsync, and
// cuMemPoolCreate to know which pools are plain device memory). The runtime's calls
// (cudaMallocAsync, cudaFreeAsync, cudaMallocFromPoolAsync, cudaMallocPitch, cudaMalloc3D)
// reach these driver entry points through cuGetProcAddress, a statically linked runtime
// included, so the driver-level replacements are the ones that matter.
//
// What each path does is in docs/shim.md (Allocation paths). Paths the shim leaves to the
// driver are counted here and named once at DELTA_VERBOSE=1.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>

#include "shim/alloc_path_symbols.h"
#include "shim/reentry_guard.h"
#include "shim/shim.h"

namespace delta::shim {

// NCCL's own allocations stay unmanaged (interpose.cpp): is the caller libnccl?
bool callerIsNccl(const void* returnAddress);

// An allocation left to the driver (`allocate` returns its CUresult and sets *where): when
// the device refuses it, managed buffers make room and it is tried again, as for cudaMalloc
// (interpose.cpp); a success is remembered as an unmanaged range, where pointer tables may be.
template <class Allocate>
CUresult allocateUnmanagedWithRoom(Allocate allocate, uint64_t bytes, const CUdeviceptr* where) {
  CUresult result = allocate();
  if (insideShim()) return result;
  Residency* residency = Shim::instance().activeIfStarted();
  if (residency == nullptr) return result;
  while (result == CUDA_ERROR_OUT_OF_MEMORY && residency->relieveDevice(bytes)) result = allocate();
  if (result == CUDA_SUCCESS && where != nullptr && *where != 0)
    residency->noteUnmanagedAllocation(*where, bytes);
  return result;
}

// What happened on these paths, for the summary and the stats line.
enum class AllocPath : int {
  kPitchManaged,        // cuMemAllocPitch made a managed buffer
  kAsyncManaged,        // cuMemAlloc(FromPool)Async made a managed buffer
  kAsyncFreeManaged,    // cuMemFreeAsync of a managed buffer (into the quarantine)
  kAsyncPassedThrough,  // a stream-ordered allocation >= DELTA_MIN_BYTES left to its pool
  kPitchPassedThrough,  // a pitched allocation >= DELTA_MIN_BYTES left to the driver
  kNcclRegistered,      // ncclCommRegister / ncclCommWindowRegister calls
  kNcclPinnedBuffers,   // managed buffers pinned by those registrations
  kNcclMemAlloc,        // ncclMemAlloc: NCCL's own memory, passed through
  kCount,
};
void countAllocPath(AllocPath path, uint64_t n = 1);
// Counts a path left to the driver, and names it once at DELTA_VERBOSE=1 with `what`.
void notePassedThrough(AllocPath path, const char* what);
uint64_t allocPathCount(AllocPath path);
// " key=value ..." for the end of the stats line (the existing keys stay first).
std::string allocPathStatsKeys();
// The summary's line about these paths (nothing when none was used).
void printAllocPathSummary();

}  // namespace delta::shim
