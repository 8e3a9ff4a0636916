// The driver entry points of the allocation paths in alloc_paths.h, as rows of real_api.h's
// table of the names the shim hands out its own functions for (no dependency on the rest of
// the shim: real_api.h includes this).
#pragma once

#include <cuda.h>

// The per-thread-default-stream variants have no declaration in cuda.h unless the program is
// built with CUDA_API_PER_THREAD_DEFAULT_STREAM (which renames the plain ones): ours.
extern "C" {
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream);
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                              CUmemoryPool pool, CUstream hStream);
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
}

namespace delta::shim {

// The third column of DELTA_MANAGED_DRIVER_SYMBOLS (real_api.h): which lookups by
// cuGetProcAddress the entry answers.
enum ProcLookup : int {
  kLegacyLookup = 0,     // without CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM only
  kAnyLookup = 1,        // both (no stream argument, or the same function either way)
  kPerThreadLookup = 2,  // with it only: the _ptsz entry point
};
constexpr bool answersLookup(int which, bool perThreadLookup) {
  return which == kPerThreadLookup ? perThreadLookup : which == kAnyLookup || !perThreadLookup;
}

}  // namespace delta::shim

// Rows for DELTA_MANAGED_DRIVER_SYMBOLS: (exported name, base name, lookups answered).
#define DELTA_ALLOC_PATH_SYMBOLS(X)                                                     \
  X(cuMemAllocPitch_v2, "cuMemAllocPitch", ::delta::shim::kAnyLookup)                    \
  X(cuMemAllocAsync, "cuMemAllocAsync", ::delta::shim::kLegacyLookup)                    \
  X(cuMemAllocAsync_ptsz, "cuMemAllocAsync", ::delta::shim::kPerThreadLookup)            \
  X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", ::delta::shim::kLegacyLookup)    \
  X(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync",                             \
    ::delta::shim::kPerThreadLookup)                                                     \
  X(cuMemFreeAsync, "cuMemFreeAsync", ::delta::shim::kLegacyLookup)                      \
  X(cuMemFreeAsync_ptsz, "cuMemFreeAsync", ::delta::shim::kPerThreadLookup)              \
  X(cuMemPoolCreate, "cuMemPoolCreate", ::delta::shim::kAnyLookup)
