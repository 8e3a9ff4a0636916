// The functions libdelta.so puts in front of the program's: cudaMalloc/cudaFree/
// cudaMemGetInfo from the runtime, cuMemAlloc/cuMemFree/cuMemGetInfo from the driver (as
// programs, the runtime and libraries reach them: by symbol, by dlsym on the driver's
// handle, or through cuGetProcAddress), and dlsym and cuGetProcAddress themselves, which
// hand out these replacements for the names the shim manages and pass everything else
// through. cuGetExportTable is never wrapped (wrapping it hangs real runtimes).
//
// Each replacement is thin: pass through when inside the shim, disabled or not active;
// otherwise one call into the residency manager.
#include <dlfcn.h>

#include <cstring>
#include <string_view>

#include "shim/cupti_switchboard.h"
#include "shim/ipc.h"
#include "shim/log.h"
#include "shim/reentry_guard.h"
#include "shim/shim.h"
#include "shim/uvm_mode.h"

#define DELTA_EXPORT extern "C" __attribute__((visibility("default")))

namespace delta::shim {
namespace {

__attribute__((constructor)) void loadLibrary() { Shim::instance().configure(); }

// The real function `name` after libdelta.so, for calls that reach us by symbol. Threads may
// race to fill the cache (they find the same answer): atomic accesses, relaxed, make that
// race defined (ThreadSanitizer found it).
// Slots for the real functions behind the replacements: filled by whichever thread looks a
// name up first (dlsym, cuGetProcAddress), read by every call.
template <class F>
F loadSlot(F& slot) {
  return __atomic_load_n(&slot, __ATOMIC_RELAXED);
}
template <class F>
void storeSlot(F& slot, void* function) {
  __atomic_store_n(&slot, reinterpret_cast<F>(function), __ATOMIC_RELAXED);
}

// The real driver function behind a replacement: the one we intercepted (dlsym or
// cuGetProcAddress), else the driver's own, else the next definition by symbol.
#define REAL_DRIVER(name)                                                              \
  (loadSlot(interceptedDriver().name) ? loadSlot(interceptedDriver().name)             \
   : Shim::instance().loadedDriver() && Shim::instance().loadedDriver()->name          \
       ? Shim::instance().loadedDriver()->name                                         \
       : nextFunction(interceptedDriver().name, #name))

// The runtime has not always made its context current on this thread when cudaMalloc is
// the first call; the real cudaMalloc would, so do that first (cudaFree(0) is the
// documented way).
void ensureRuntimeContext() {
  static thread_local bool ready = false;
  if (ready) return;
  ReentryGuard guard;
  if (auto realFree = runtimeApi().cudaFree) realFree(nullptr);
  ready = true;
}

}  // namespace

// NCCL's allocations (made by NCCL's own statically linked runtime, or by NCCL directly)
// stay unmanaged: its kernels reach them through its device structures, out of our sight.
bool callerIsNccl(const void* returnAddress) {
  Dl_info info;
  if (returnAddress == nullptr || dladdr(returnAddress, &info) == 0 || info.dli_fname == nullptr)
    return false;
  const char* slash = std::strrchr(info.dli_fname, '/');
  return std::strncmp(slash ? slash + 1 : info.dli_fname, "libnccl", 7) == 0;
}

namespace {

Residency* managing(size_t bytes) {
  if (insideShim()) return nullptr;
  Shim& shim = Shim::instance();
  if (shim.disabled() || bytes < shim.minManagedBytes()) return nullptr;
  return shim.active();
}

Residency* managingFree() {
  if (insideShim()) return nullptr;
  Shim& shim = Shim::instance();
  if (shim.disabled()) return nullptr;
  return shim.active();
}

void reportBudget(Residency& residency, size_t* free, size_t* total) {
  // Frameworks size themselves from this: tell them the budget, not the device (and, where the
  // device holds less than the budget, the room under the effective ceiling).
  const uint64_t budget = residency.budget();
  const uint64_t limit = residency.limit();
  const Stats stats = residency.stats();
  const uint64_t resident = stats.residentBytes + stats.foreignBytes;
  if (total) *total = budget;
  if (free) *free = resident < limit ? limit - resident : 0;
}

// An allocation the shim leaves to the driver (below DELTA_MIN_BYTES, or one it could not
// manage). When the device is full, managed buffers make room for it: an allocation that
// eviction could satisfy must not fail. A success is remembered as an unmanaged range, where
// pointer tables may be stored.
template <class Allocate, class OutOfMemory>
auto allocateUnmanaged(Allocate allocate, OutOfMemory outOfMemory, size_t bytes, const void** where) {
  auto result = allocate();
  if (insideShim()) return result;
  Residency* residency = Shim::instance().activeIfStarted();
  if (residency == nullptr) return result;
  while (outOfMemory(result) && residency->relieveDevice(bytes)) result = allocate();
  if (!outOfMemory(result) && *where != nullptr)
    residency->noteUnmanagedAllocation(reinterpret_cast<CUdeviceptr>(*where), bytes);
  return result;
}

// Names the shim hands out its own functions for (real_api.h's table, and cuGetProcAddress).
bool isManagedDriverSymbol(std::string_view name) {
#define DELTA_IS_NAME(entry, procBase, perThreadToo) name == #entry ||
  return DELTA_MANAGED_DRIVER_SYMBOLS(DELTA_IS_NAME) name == "cuGetProcAddress";
#undef DELTA_IS_NAME
}

}  // namespace
}  // namespace delta::shim

using namespace delta::shim;

// ---- the runtime ------------------------------------------------------------------------

namespace {

// cudaMalloc left to the runtime, made room for when the device is full.
cudaError_t runtimeMallocUnmanaged(decltype(RuntimeApi::cudaMalloc) real, void** devPtr,
                                   size_t size) {
  const void* where = nullptr;
  bool failedOnce = false;
  cudaError_t result = allocateUnmanaged(
      [&] {
        cudaError_t r = real(devPtr, size);
        where = r == cudaSuccess ? *devPtr : nullptr;
        failedOnce |= r == cudaErrorMemoryAllocation;
        return r;
      },
      [](cudaError_t r) { return r == cudaErrorMemoryAllocation; }, size, &where);
  // The attempt that failed left its error as the thread's last one; the call succeeded.
  if (result == cudaSuccess && failedOnce && runtimeApi().cudaGetLastError)
    runtimeApi().cudaGetLastError();
  return result;
}

}  // namespace

DELTA_EXPORT cudaError_t cudaMalloc(void** devPtr, size_t size) {
  auto real = runtimeApi().cudaMalloc;
  if (real == nullptr) return cudaErrorInsufficientDriver;
  if (devPtr == nullptr || size == 0 || insideShim() ||
      callerIsNccl(__builtin_return_address(0)))
    return real(devPtr, size);
  ensureRuntimeContext();
  if (UvmMode* uvm = uvmManaging(size)) {  // DELTA_MODE=uvm
    CUdeviceptr address = 0;
    if (uvm->allocate(size, &address) != CUDA_SUCCESS) return real(devPtr, size);
    *devPtr = reinterpret_cast<void*>(address);
    return cudaSuccess;
  }
  Residency* residency = managing(size);
  if (residency == nullptr) return runtimeMallocUnmanaged(real, devPtr, size);
  CUdeviceptr address = 0;
  CUresult result = residency->allocate(size, &address);
  if (result == CUDA_SUCCESS) {
    *devPtr = reinterpret_cast<void*>(address);
    return cudaSuccess;
  }
  if (result == CUDA_ERROR_OUT_OF_MEMORY && Shim::instance().options().strict)
    return cudaErrorMemoryAllocation;  // the budget is the limit, not the device
  // Out of buffer ids, or the device full even after evicting what could go: the runtime
  // answers (and records its own last error).
  return runtimeMallocUnmanaged(real, devPtr, size);
}

DELTA_EXPORT cudaError_t cudaFree(void* devPtr) {
  auto real = runtimeApi().cudaFree;
  if (real == nullptr) return cudaErrorInsufficientDriver;
  if (devPtr == nullptr) return real(devPtr);
  if (UvmMode* uvm = uvmStarted(); uvm && uvm->free(reinterpret_cast<CUdeviceptr>(devPtr)))
    return cudaSuccess;
  if (Residency* residency = managingFree();
      residency && residency->free(reinterpret_cast<CUdeviceptr>(devPtr)))
    return cudaSuccess;
  return real(devPtr);
}

DELTA_EXPORT cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  auto real = runtimeApi().cudaMemGetInfo;
  if (real == nullptr) return cudaErrorInsufficientDriver;
  cudaError_t result = real(free, total);
  if (result != cudaSuccess || insideShim()) return result;
  if (UvmMode* uvm = uvmReporting()) uvm->reportBudget(free, total);
  if (Residency* residency = managingFree()) reportBudget(*residency, free, total);
  return result;
}

// ---- IPC: managed buffers are shared by the shim itself (see ipc.h) ---------------------

namespace delta::shim {
namespace {

// The driver functions, once the shim has loaded them (activating it if need be).
const DriverApi* loadedDriver() {
  Shim& shim = Shim::instance();
  if (shim.disabled() || insideShim()) return nullptr;
  shim.active();
  return shim.driver().cuMemImportFromShareableHandle ? &shim.driver() : nullptr;
}

}  // namespace
}  // namespace delta::shim

namespace {
decltype(&::cuIpcGetMemHandle) gRealCuIpcGet = nullptr;
}

DELTA_EXPORT cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* devPtr) {
  auto real = runtimeApi().cudaIpcGetMemHandle;
  if (real == nullptr) return cudaErrorInsufficientDriver;
  if (Residency* residency = managingFree(); residency && handle) {
    CUresult r = exportIpcHandle(*residency, reinterpret_cast<CUdeviceptr>(devPtr),
                                 reinterpret_cast<CUipcMemHandle*>(handle));
    if (r != CUDA_ERROR_NOT_FOUND) return static_cast<cudaError_t>(r);
  }
  return real(handle, devPtr);
}

DELTA_EXPORT cudaError_t cudaIpcOpenMemHandle(void** devPtr, cudaIpcMemHandle_t handle,
                                              unsigned int flags) {
  auto real = runtimeApi().cudaIpcOpenMemHandle;
  if (real == nullptr) return cudaErrorInsufficientDriver;
  // The runtime loads the driver; let it, before the shim looks for it.
  if (devPtr != nullptr && !insideShim()) ensureRuntimeContext();
  if (const DriverApi* api = devPtr ? loadedDriver() : nullptr) {
    CUipcMemHandle driverHandle;
    std::memcpy(&driverHandle, &handle, sizeof driverHandle);
    CUresult r = openIpcHandle(*api, driverHandle, reinterpret_cast<CUdeviceptr*>(devPtr));
    if (r != CUDA_ERROR_NOT_FOUND) return static_cast<cudaError_t>(r);
  }
  return real(devPtr, handle, flags);
}

DELTA_EXPORT cudaError_t cudaIpcCloseMemHandle(void* devPtr) {
  auto real = runtimeApi().cudaIpcCloseMemHandle;
  if (real == nullptr) return cudaErrorInsufficientDriver;
  if (const DriverApi* api = loadedDriver()) {
    CUresult r = closeIpcHandle(*api, reinterpret_cast<CUdeviceptr>(devPtr));
    if (r != CUDA_ERROR_NOT_FOUND) return static_cast<cudaError_t>(r);
  }
  return real(devPtr);
}

DELTA_EXPORT CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  auto real = loadSlot(interceptedDriver().cuIpcGetMemHandle)
                  ? loadSlot(interceptedDriver().cuIpcGetMemHandle)
                  : nextFunction(gRealCuIpcGet, "cuIpcGetMemHandle");
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (Residency* residency = managingFree(); residency && pHandle) {
    CUresult r = exportIpcHandle(*residency, dptr, pHandle);
    if (r != CUDA_ERROR_NOT_FOUND) return r;
  }
  return real(pHandle, dptr);
}

DELTA_EXPORT CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle,
                                                   unsigned int Flags) {
  auto real = REAL_DRIVER(cuIpcOpenMemHandle_v2);
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (const DriverApi* api = pdptr ? loadedDriver() : nullptr) {
    CUresult r = openIpcHandle(*api, handle, pdptr);
    if (r != CUDA_ERROR_NOT_FOUND) return r;
  }
  return real(pdptr, handle, Flags);
}

DELTA_EXPORT CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr) {
  auto real = REAL_DRIVER(cuIpcCloseMemHandle);
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (const DriverApi* api = loadedDriver()) {
    CUresult r = closeIpcHandle(*api, dptr);
    if (r != CUDA_ERROR_NOT_FOUND) return r;
  }
  return real(dptr);
}

// Launches are seen through CUPTI. They are also prepared here, before the real call, when a
// launch may have to fail — a CUPTI callback cannot make the call fail: under DELTA_STRICT=1
// (a working set the budget cannot hold), and once buffers are registered for recompute (a
// recompute callback that fails, a framework that did not regenerate a dropped buffer).
namespace delta::shim {
namespace {

Residency* preparingLaunches() {
  if (insideShim()) return nullptr;
  Shim& shim = Shim::instance();
  if (shim.disabled()) return nullptr;
  Residency* residency = shim.activeIfStarted();
  if (residency == nullptr || !(shim.options().strict || residency->anyRecomputable()))
    return nullptr;
  return residency;
}

}  // namespace
}  // namespace delta::shim

namespace {
decltype(&::cudaLaunchKernel) gRealCudaLaunchKernel = nullptr;
}

DELTA_EXPORT cudaError_t cudaLaunchKernel(const void* func, dim3 gridDim, dim3 blockDim,
                                          void** args, size_t sharedMem, cudaStream_t stream) {
  auto real = nextFunction(gRealCudaLaunchKernel, "cudaLaunchKernel");
  if (real == nullptr) return cudaErrorInsufficientDriver;
  if (preparingLaunches() == nullptr || launchAlreadyPrepared())
    return real(func, gridDim, blockDim, args, sharedMem, stream);
  if (CUresult r = prepareRuntimeLaunch(func, reinterpret_cast<CUstream>(stream), false, args);
      r != CUDA_SUCCESS)
    return r == CUDA_ERROR_OUT_OF_MEMORY ? cudaErrorMemoryAllocation : cudaErrorUnknown;
  PreparedLaunchScope prepared;
  return real(func, gridDim, blockDim, args, sharedMem, stream);
}

// ---- the driver -------------------------------------------------------------------------

DELTA_EXPORT CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX,
                                            unsigned int gridDimY, unsigned int gridDimZ,
                                            unsigned int blockDimX, unsigned int blockDimY,
                                            unsigned int blockDimZ, unsigned int sharedMemBytes,
                                            CUstream hStream, void** kernelParams, void** extra) {
  auto real = REAL_DRIVER(cuLaunchKernel);
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (preparingLaunches() != nullptr && !launchAlreadyPrepared()) {
    if (CUresult r = prepareKernelLaunch(f, hStream, false, kernelParams, extra); r != CUDA_SUCCESS)
      return r;
    PreparedLaunchScope prepared;
    return real(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                hStream, kernelParams, extra);
  }
  return real(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
              hStream, kernelParams, extra);
}

DELTA_EXPORT CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  auto real = REAL_DRIVER(cuMemAlloc_v2);
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (dptr == nullptr || bytesize == 0 || callerIsNccl(__builtin_return_address(0)))
    return real(dptr, bytesize);
  if (UvmMode* uvm = uvmManaging(bytesize))  // DELTA_MODE=uvm
    return uvm->allocate(bytesize, dptr) == CUDA_SUCCESS ? CUDA_SUCCESS : real(dptr, bytesize);
  auto unmanaged = [&] {
    const void* where = nullptr;
    return allocateUnmanaged(
        [&] {
          CUresult r = real(dptr, bytesize);
          where = r == CUDA_SUCCESS ? reinterpret_cast<const void*>(*dptr) : nullptr;
          return r;
        },
        [](CUresult r) { return r == CUDA_ERROR_OUT_OF_MEMORY; }, bytesize, &where);
  };
  Residency* residency = managing(bytesize);
  if (residency == nullptr) return unmanaged();
  CUcontext context = nullptr;
  // Without a current context the real call fails; so must we, the same way.
  if (Shim::instance().driver().cuCtxGetCurrent(&context) != CUDA_SUCCESS || context == nullptr)
    return real(dptr, bytesize);
  CUresult result = residency->allocate(bytesize, dptr);
  if (result == CUDA_ERROR_NOT_SUPPORTED) return unmanaged();
  // Out of memory without DELTA_STRICT is the device's answer, not the budget's (the budget
  // only ever runs over), given after evicting what could go: the driver answers for itself.
  // cudaMalloc's fallback to the runtime comes through here too, so without this the program
  // got the shim's error, not the driver's, even where plain cuMemAlloc would have succeeded.
  if (result == CUDA_ERROR_OUT_OF_MEMORY && !Shim::instance().options().strict) {
    DELTA_WARN_ONCE("the device refused memory for a managed buffer of %llu MiB (cuMemCreate: "
                    "out of memory, and evicting could not help); such allocations are left to "
                    "the driver, unmanaged",
                    (unsigned long long)(bytesize >> 20));
    return unmanaged();
  }
  return result;
}

DELTA_EXPORT CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  auto real = REAL_DRIVER(cuMemFree_v2);
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (UvmMode* uvm = uvmStarted(); uvm && dptr != 0 && uvm->free(dptr)) return CUDA_SUCCESS;
  if (Residency* residency = managingFree(); residency && dptr != 0 && residency->free(dptr))
    return CUDA_SUCCESS;
  return real(dptr);
}

DELTA_EXPORT CUresult CUDAAPI cuMemGetInfo_v2(size_t* free, size_t* total) {
  auto real = REAL_DRIVER(cuMemGetInfo_v2);
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult result = real(free, total);
  if (result != CUDA_SUCCESS || insideShim()) return result;
  if (UvmMode* uvm = uvmReporting()) uvm->reportBudget(free, total);
  if (Residency* residency = managingFree()) reportBudget(*residency, free, total);
  return result;
}

// The program's own physical memory (a framework's virtual memory): each mapping of it is paged
// like a managed buffer, and the program's handles are the shim's stand-ins
// (framework_memory.cpp). NCCL's (its peers map it) and other devices' and the host's are
// left alone; NCCL's is counted in the budget.
DELTA_EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                         const CUmemAllocationProp* prop,
                                         unsigned long long flags) {
  auto real = REAL_DRIVER(cuMemCreate);
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  Residency* residency = managingFree();
  // Only memory of the device whose budget this is (Residency maps on ordinal 0).
  if (residency == nullptr || handle == nullptr || size == 0 || prop == nullptr ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id != 0)
    return real(handle, size, prop, flags);
  const bool nccl = callerIsNccl(__builtin_return_address(0));
  residency->beforeForeignCreate(size);
  CUmemGenericAllocationHandle made = 0;
  CUresult result = real(&made, size, prop, flags);
  // The device may hold less than the budget: what managed buffers give back is tried.
  while (result == CUDA_ERROR_OUT_OF_MEMORY && residency->relieveDevice(size))
    result = real(&made, size, prop, flags);
  if (result != CUDA_SUCCESS) return result;
  if (nccl) {
    residency->noteForeignCreate(made, size);
    *handle = made;
  } else {
    residency->adoptProgramHandle(made, size, *prop, handle);
  }
  return CUDA_SUCCESS;
}

// The calls that take one of those handles, or an address mapped from one: the shim's answer
// for its own, the driver's for the rest.
#define DELTA_PROGRAM_MEMORY_CALL(name, call, ...)              \
  auto real = REAL_DRIVER(name);                                \
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;       \
  if (Residency* residency = managingFree())                    \
    if (std::optional<CUresult> ours = residency->call) return *ours; \
  return real(__VA_ARGS__)

DELTA_EXPORT CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  DELTA_PROGRAM_MEMORY_CALL(cuMemRelease, releaseProgramHandle(handle), handle);
}

DELTA_EXPORT CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                      CUmemGenericAllocationHandle handle,
                                      unsigned long long flags) {
  DELTA_PROGRAM_MEMORY_CALL(cuMemMap, mapProgramHandle(ptr, size, offset, handle, flags), ptr,
                            size, offset, handle, flags);
}

DELTA_EXPORT CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  DELTA_PROGRAM_MEMORY_CALL(cuMemUnmap, unmapProgramRange(ptr, size), ptr, size);
}

DELTA_EXPORT CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size,
                                            const CUmemAccessDesc* desc, size_t count) {
  DELTA_PROGRAM_MEMORY_CALL(cuMemSetAccess, setProgramAccess(ptr, size, desc, count), ptr, size,
                            desc, count);
}

DELTA_EXPORT CUresult CUDAAPI cuMemExportToShareableHandle(void* shareableHandle,
                                                          CUmemGenericAllocationHandle handle,
                                                          CUmemAllocationHandleType handleType,
                                                          unsigned long long flags) {
  DELTA_PROGRAM_MEMORY_CALL(cuMemExportToShareableHandle,
                            exportProgramHandle(shareableHandle, handle, handleType, flags),
                            shareableHandle, handle, handleType, flags);
}

DELTA_EXPORT CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(
    CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  DELTA_PROGRAM_MEMORY_CALL(cuMemGetAllocationPropertiesFromHandle,
                            programHandleProperties(prop, handle), prop, handle);
}

DELTA_EXPORT CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle,
                                                         void* addr) {
  DELTA_PROGRAM_MEMORY_CALL(cuMemRetainAllocationHandle,
                            retainProgramHandle(handle, reinterpret_cast<CUdeviceptr>(addr)),
                            handle, addr);
}
#undef DELTA_PROGRAM_MEMORY_CALL

namespace delta::shim {
namespace {

void* replacementFor(std::string_view name);

// The answer of cuGetProcAddress, with our replacements for the names we manage.
CUresult answerProcAddress(CUresult result, const char* symbol, void** pfn, cuuint64_t flags) {
  if (result != CUDA_SUCCESS || pfn == nullptr || *pfn == nullptr || symbol == nullptr ||
      Shim::instance().disabled())
    return result;
  const std::string_view base = symbol;
  const bool perThread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  InterceptedDriver& real = interceptedDriver();
#define DELTA_ANSWER(entry, procBase, perThreadToo)                                \
  if (!base.empty() && base == procBase && answersLookup(perThreadToo, perThread)) {\
    storeSlot(real.entry, *pfn);                                                    \
    *pfn = replacementFor(#entry);                                                  \
    return result;                                                                  \
  }
  DELTA_MANAGED_DRIVER_SYMBOLS(DELTA_ANSWER)
#undef DELTA_ANSWER
  return result;
}

}  // namespace
}  // namespace delta::shim

DELTA_EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                                 cuuint64_t flags,
                                                 CUdriverProcAddressQueryResult* symbolStatus) {
  auto real = loadSlot(interceptedDriver().cuGetProcAddress_v2)
                  ? loadSlot(interceptedDriver().cuGetProcAddress_v2)
                  : nextFunction(interceptedDriver().cuGetProcAddress_v2, "cuGetProcAddress_v2");
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult result = real(symbol, pfn, cudaVersion, flags, symbolStatus);
  if (insideShim()) return result;
  return answerProcAddress(result, symbol, pfn, flags);
}

#undef cuGetProcAddress
using GetProcAddressV1 = CUresult (*)(const char*, void**, int, cuuint64_t);
namespace {
GetProcAddressV1 gRealGetProcAddressV1 = nullptr;
}

DELTA_EXPORT CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                              cuuint64_t flags) {
  auto real = nextFunction(gRealGetProcAddressV1, "cuGetProcAddress");
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult result = real(symbol, pfn, cudaVersion, flags);
  if (insideShim()) return result;
  return answerProcAddress(result, symbol, pfn, flags);
}

namespace delta::shim {
namespace {

void* replacementFor(std::string_view name) {
#define DELTA_REPLACEMENT(entry, procBase, perThreadToo) \
  if (name == #entry) return reinterpret_cast<void*>(&::entry);
  DELTA_MANAGED_DRIVER_SYMBOLS(DELTA_REPLACEMENT)
#undef DELTA_REPLACEMENT
  if (name == "cuGetProcAddress") return reinterpret_cast<void*>(&::cuGetProcAddress);
  return nullptr;
}

}  // namespace
}  // namespace delta::shim

// ---- dlsym --------------------------------------------------------------------------------

// The CUDA runtime opens libcuda.so.1 and looks its entry points up with dlsym on that
// handle, which never finds an LD_PRELOAD library's definitions: so dlsym itself is wrapped.
// Lookups with RTLD_DEFAULT/RTLD_NEXT, and of names the shim does not manage, go to glibc's
// dlsym unchanged. On x86-64 the exported dlsym is the entry in dlsym_entry.S, which jumps to
// glibc's with the caller's return address, so RTLD_NEXT is the caller's next object, as
// without the shim (sanitizer runtimes rely on that). Elsewhere the C++ dlsym below calls it,
// and RTLD_NEXT is resolved relative to libdelta.so (see docs/shim.md).

// What dlsym does: answer `answer`, or, if next is set, tail-call next(handle, symbol).
struct DlsymDecision {
  void* answer;
  void* next;
};

// Cheapest first, no thread-local access, no allocation and no sanitizer instrumentation
// before it is needed: sanitizer runtimes call dlsym(RTLD_NEXT, ...) while they initialise,
// before constructors run, when even __tls_get_addr is not ready.
extern "C" __attribute__((visibility("hidden"), no_sanitize("address", "undefined", "thread")))
DlsymDecision delta_dlsymDecide(void* handle, const char* symbol) {
  DlsymFunction real = realDlsym();
  if (real == nullptr) return {nullptr, nullptr};  // glibc's dlsym not found: nothing to answer
  const DlsymDecision passThrough{nullptr, reinterpret_cast<void*>(real)};
  if (handle == RTLD_DEFAULT || handle == RTLD_NEXT || symbol == nullptr ||
      !isManagedDriverSymbol(symbol) || insideShim() || Shim::instance().disabled())
    return passThrough;
  void* found = real(handle, symbol);  // an explicit handle: the caller does not matter
  if (found == nullptr) return {nullptr, nullptr};
  std::string_view name = symbol;
  InterceptedDriver& intercepted = interceptedDriver();
#define DELTA_KEEP_REAL(entry, procBase, perThreadToo) \
  if (name == #entry) storeSlot(intercepted.entry, found);
  DELTA_MANAGED_DRIVER_SYMBOLS(DELTA_KEEP_REAL)
#undef DELTA_KEEP_REAL
  if (name == "cuGetProcAddress") storeSlot(gRealGetProcAddressV1, found);
  return {replacementFor(name), nullptr};
}

#if !(defined(__x86_64__) && defined(__linux__))
// No assembly entry for this architecture: RTLD_NEXT is answered relative to libdelta.so.
DELTA_EXPORT void* dlsym(void* handle, const char* symbol) {
  const DlsymDecision decision = delta_dlsymDecide(handle, symbol);
  if (decision.next == nullptr) return decision.answer;
  return reinterpret_cast<DlsymFunction>(decision.next)(handle, symbol);
}
#endif
