// Stream-ordered allocation: cuMemAllocAsync, cuMemAllocFromPoolAsync and cuMemFreeAsync (and
// their _ptsz forms), which cudaMallocAsync, cudaMallocFromPoolAsync and cudaFreeAsync reach
// (PyTorch's backend:cudaMallocAsync among them); and cuMemPoolCreate, to know which pools
// hold plain device memory.
//
// An allocation of at least DELTA_MIN_BYTES from a plain pool of the managed device (the
// device's default pool, or one created with nothing but a device location: not exportable,
// no maximum size, no special usage) becomes a managed buffer, as cudaMalloc's do. It is
// mapped before the call returns, so it is usable by the stream's later work, which is all that
// stream order promises. Its free on a stream puts it in the shim's quarantine with one event
// more, recorded on that stream: its memory is reused only after the stream's work before the
// free, as the driver promises, and after every other use the shim saw, as for cudaFree.
//
// Left to the pool (and counted): allocations from a pool the shim cannot stand in for (an
// exportable pool is shared with other processes by its own handles; a capped pool must fail
// when full; a pool of another device or of host memory is not the managed device's memory),
// allocations under DELTA_MIN_BYTES, those NCCL makes, and all of them under DELTA_MODE=uvm.
// The pool's own attributes (USED_MEM_*, RESERVED_MEM_*) count what it holds: not the managed
// buffers. Its release threshold and cuMemPoolTrimTo work on what it holds, as before.
//
// cuMemFree/cudaFree of a managed stream-ordered allocation frees it as cudaFree's; a free of
// anything else (stream-ordered or not) goes to the driver: each pointer to whoever made it.
#include <dlfcn.h>

#include <cstring>
#include <mutex>
#include <unordered_map>

#include "shim/alloc_paths.h"
#include "shim/log.h"
#include "shim/reentry_guard.h"
#include "shim/shim.h"
#include "shim/uvm_mode.h"

#define DELTA_EXPORT extern "C" __attribute__((visibility("default")))

namespace delta::shim {
namespace {

// The device whose memory the shim manages: Residency maps its buffers on ordinal 0.
constexpr int kManagedDevice = 0;

#define REAL_ENTRY(name) nextFunction(interceptedDriver().name, #name)

// Driver functions only this file needs, fetched once the shim is active (its driver loaded).
struct PoolDriver {
  decltype(&::cuCtxGetDevice) cuCtxGetDevice = nullptr;
  decltype(&::cuDeviceGetMemPool) cuDeviceGetMemPool = nullptr;
  decltype(&::cuDeviceGetDefaultMemPool) cuDeviceGetDefaultMemPool = nullptr;
  CUmemoryPool defaultPool = nullptr;  // of kManagedDevice
  bool complete = false;
};

const PoolDriver& poolDriver() {
  static const PoolDriver driver = [] {
    PoolDriver found;
    const DriverApi& api = Shim::instance().driver();
    if (api.cuGetProcAddress_v2 == nullptr) return found;
    auto fetch = [&](const char* name, auto** out) {
      return api.cuGetProcAddress_v2(name, reinterpret_cast<void**>(out), CUDA_VERSION,
                                     CU_GET_PROC_ADDRESS_DEFAULT, nullptr) == CUDA_SUCCESS &&
             *out != nullptr;
    };
    ReentryGuard guard;
    found.complete = fetch("cuCtxGetDevice", &found.cuCtxGetDevice) &&
                     fetch("cuDeviceGetMemPool", &found.cuDeviceGetMemPool) &&
                     fetch("cuDeviceGetDefaultMemPool", &found.cuDeviceGetDefaultMemPool) &&
                     found.cuDeviceGetDefaultMemPool(&found.defaultPool, kManagedDevice) ==
                         CUDA_SUCCESS;
    return found;
  }();
  return driver;
}

// Pools made through cuMemPoolCreate: whether each is plain device memory of the managed
// device. Never destroyed (calls may come during exit); a handle the driver reuses for a new
// pool is written again by that pool's creation.
std::mutex gPoolsMutex;
std::unordered_map<CUmemoryPool, bool>& pools() {
  static auto* known = new std::unordered_map<CUmemoryPool, bool>;
  return *known;
}

bool plainProperties(const CUmemPoolProps& props) {
  static const unsigned char kZero[sizeof props.reserved] = {};
  return props.allocType == CU_MEM_ALLOCATION_TYPE_PINNED &&
         props.location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
         props.location.id == kManagedDevice && props.handleTypes == CU_MEM_HANDLE_TYPE_NONE &&
         props.win32SecurityAttributes == nullptr && props.maxSize == 0 && props.usage == 0 &&
         std::memcmp(props.reserved, kZero, sizeof kZero) == 0;
}

// Whether the shim may stand in for `pool` (nullptr: the current pool of the current device).
bool managedPool(CUmemoryPool pool) {
  const PoolDriver& driver = poolDriver();
  if (!driver.complete) return false;
  ReentryGuard guard;
  if (pool == nullptr) {
    CUdevice device = -1;
    if (driver.cuCtxGetDevice(&device) != CUDA_SUCCESS || device != kManagedDevice ||
        driver.cuDeviceGetMemPool(&pool, device) != CUDA_SUCCESS)
      return false;
  }
  if (pool == driver.defaultPool) return true;
  std::lock_guard lock(gPoolsMutex);
  auto it = pools().find(pool);
  return it != pools().end() && it->second;  // unknown: made before us, or not by the driver
}

// cuMemAllocAsync (pool nullptr) and cuMemAllocFromPoolAsync: a managed buffer when the shim
// may stand in for the pool, else the real call.
template <class Real>
CUresult allocateStreamOrdered(Real real, CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool,
                               const void* caller) {
  if (dptr == nullptr || bytes == 0 || insideShim() || callerIsNccl(caller)) return real();
  Shim& shim = Shim::instance();
  if (shim.disabled()) return real();
  auto unmanaged = [&] { return allocateUnmanagedWithRoom(real, bytes, dptr); };
  if (uvmManaging(bytes) != nullptr) {
    notePassedThrough(AllocPath::kAsyncPassedThrough,
                      "stream-ordered allocations (cudaMallocAsync, cuMemAllocAsync) are left to "
                      "their pool under DELTA_MODE=uvm");
    return real();
  }
  Residency* residency = bytes < shim.minManagedBytes() ? nullptr : shim.active();
  if (residency == nullptr) return unmanaged();
  CUcontext context = nullptr;
  // Without a current context the real call fails; so must we, the same way.
  if (shim.driver().cuCtxGetCurrent(&context) != CUDA_SUCCESS || context == nullptr)
    return real();
  if (!managedPool(pool)) {
    notePassedThrough(AllocPath::kAsyncPassedThrough,
                      "stream-ordered allocations from a pool that is not plain memory of device 0 "
                      "(exportable, capped, or of another device) are left to the pool, unmanaged "
                      "and never evicted");
    return unmanaged();
  }
  CUresult result = residency->allocate(bytes, dptr);
  if (result == CUDA_SUCCESS) {
    countAllocPath(AllocPath::kAsyncManaged);
    return CUDA_SUCCESS;
  }
  if (result == CUDA_ERROR_OUT_OF_MEMORY && shim.options().strict) return result;
  notePassedThrough(AllocPath::kAsyncPassedThrough,
                    "a stream-ordered allocation the shim could not manage (out of buffer ids, or "
                    "the device full) is left to its pool, unmanaged");
  return unmanaged();
}

CUresult freeStreamOrdered(decltype(&::cuMemFreeAsync) real, CUdeviceptr dptr, CUstream stream,
                           bool perThreadApi) {
  if (dptr != 0 && !insideShim() && !Shim::instance().disabled()) {
    if (Residency* residency = Shim::instance().activeIfStarted()) {
      CUresult result = residency->freeOrdered(dptr, stream, perThreadApi);
      if (result == CUDA_SUCCESS) countAllocPath(AllocPath::kAsyncFreeManaged);
      if (result != CUDA_ERROR_NOT_FOUND) return result;
    }
  }
  return real(dptr, stream);
}

}  // namespace
}  // namespace delta::shim

using namespace delta::shim;

DELTA_EXPORT CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  auto real = REAL_ENTRY(cuMemAllocAsync);
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return allocateStreamOrdered([&] { return real(dptr, bytesize, hStream); }, dptr, bytesize,
                               nullptr, __builtin_return_address(0));
}

DELTA_EXPORT CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                                  CUstream hStream) {
  auto real = REAL_ENTRY(cuMemAllocAsync_ptsz);
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return allocateStreamOrdered([&] { return real(dptr, bytesize, hStream); }, dptr, bytesize,
                               nullptr, __builtin_return_address(0));
}

DELTA_EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize,
                                                     CUmemoryPool pool, CUstream hStream) {
  auto real = REAL_ENTRY(cuMemAllocFromPoolAsync);
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  // A null pool is the caller's error: the driver says so.
  if (pool == nullptr) return real(dptr, bytesize, pool, hStream);
  return allocateStreamOrdered([&] { return real(dptr, bytesize, pool, hStream); }, dptr,
                               bytesize, pool, __builtin_return_address(0));
}

DELTA_EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                                          CUmemoryPool pool, CUstream hStream) {
  auto real = REAL_ENTRY(cuMemAllocFromPoolAsync_ptsz);
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (pool == nullptr) return real(dptr, bytesize, pool, hStream);
  return allocateStreamOrdered([&] { return real(dptr, bytesize, pool, hStream); }, dptr,
                               bytesize, pool, __builtin_return_address(0));
}

DELTA_EXPORT CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  auto real = REAL_ENTRY(cuMemFreeAsync);
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return freeStreamOrdered(real, dptr, hStream, false);
}

DELTA_EXPORT CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  auto real = REAL_ENTRY(cuMemFreeAsync_ptsz);
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return freeStreamOrdered(real, dptr, hStream, true);
}

DELTA_EXPORT CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* poolProps) {
  auto real = REAL_ENTRY(cuMemPoolCreate);
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult result = real(pool, poolProps);
  if (result == CUDA_SUCCESS && pool != nullptr && poolProps != nullptr) {
    std::lock_guard lock(gPoolsMutex);
    pools()[*pool] = plainProperties(*poolProps);
  }
  return result;
}
