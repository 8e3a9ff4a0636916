// cudasim's libcudart.so.13: the runtime calls the test programs use.
//
// It reaches the driver exactly the way the real runtime does: dlopen("libcuda.so.1"),
// dlsym on that handle for cuGetProcAddress_v2 (and cuGetProcAddress), then every other
// driver function through cuGetProcAddress. A driver-level interposer that wraps dlsym and
// cuGetProcAddress therefore sees exactly what it would see under the real runtime.
// Private services (kernel registration, the CUPTI slot) come from cuGetExportTable.
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <generated_cuda_runtime_api_meta.h>

#include "../common/callback_scope.h"
#include "../common/export_table.h"
#include "cudasim/cudasim.h"

namespace cudasim {
namespace {

constexpr int kRuntimeVersion = 13000;

// The driver functions the runtime uses, fetched through cuGetProcAddress.
struct DriverApi {
#define DRIVER_FUNCTION(name) decltype(&::name) name = nullptr;
#define DRIVER_FUNCTIONS(X)                                                                     \
  X(cuInit) X(cuDriverGetVersion) X(cuGetExportTable) X(cuDeviceGetCount) X(cuDeviceGet)          \
  X(cuDeviceGetName) X(cuDeviceTotalMem_v2) X(cuDeviceGetAttribute) X(cuDevicePrimaryCtxRetain)  \
  X(cuCtxSetCurrent) X(cuCtxSynchronize) X(cuMemGetInfo_v2) X(cuMemAlloc_v2) X(cuMemFree_v2)       \
  X(cuMemAllocHost_v2) X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemHostRegister_v2)                 \
  X(cuMemHostUnregister) X(cuMemHostGetDevicePointer_v2) X(cuMemcpy) X(cuMemcpyAsync)             \
  X(cuMemcpyHtoD_v2) X(cuMemcpyDtoH_v2) X(cuMemcpyDtoD_v2) X(cuMemcpyHtoDAsync_v2)                \
  X(cuMemcpyDtoHAsync_v2) X(cuMemcpyDtoDAsync_v2) X(cuMemsetD8_v2) X(cuMemsetD8Async)             \
  X(cuStreamCreate) X(cuStreamCreateWithPriority) X(cuStreamDestroy_v2) X(cuStreamSynchronize)   \
  X(cuStreamQuery) X(cuStreamWaitEvent) X(cuEventCreate) X(cuEventDestroy_v2) X(cuEventRecord)    \
  X(cuEventQuery) X(cuEventSynchronize) X(cuEventElapsedTime_v2) X(cuLaunchKernel)                \
  X(cuLaunchKernelEx) X(cuLaunchHostFunc) X(cuFuncGetParamInfo) X(cuFuncGetName)                  \
  X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle_v2) X(cuIpcCloseMemHandle) X(cuGetProcAddress_v2)      \
  X(cuMemAllocPitch_v2) X(cuMemcpy2D_v2) X(cuMemcpy2DAsync_v2) X(cuMemAllocAsync)                 \
  X(cuMemAllocFromPoolAsync) X(cuMemFreeAsync) X(cuMemPoolCreate) X(cuMemPoolDestroy)             \
  X(cuMemPoolSetAttribute) X(cuMemPoolGetAttribute) X(cuMemPoolTrimTo) X(cuMemPoolSetAccess)      \
  X(cuMemPoolGetAccess) X(cuDeviceGetDefaultMemPool) X(cuDeviceGetMemPool) X(cuDeviceSetMemPool)
  DRIVER_FUNCTIONS(DRIVER_FUNCTION)
#undef DRIVER_FUNCTION
};

// The base names cuGetProcAddress knows them by.
std::string baseName(const char* name) {
  std::string base = name;
  if (base.size() > 3 && base.compare(base.size() - 3, 3, "_v2") == 0) base.resize(base.size() - 3);
  return base;
}

struct PendingKernel {
  const void* symbol;
  std::string name;
  cudasimKernelBody body;
  std::vector<size_t> sizes;
};

DriverApi gApi;
DriverApi gApiPerThread;  // the _ptsz/_ptds variants, for the runtime's own _ptsz/_ptds calls
const ExportTable* gTable = nullptr;
CallbackState* gCallbacks = nullptr;  // set once initialised
CUcontext gPrimary = nullptr;
cudaError_t gInitError = cudaSuccess;
std::once_flag gInitOnce;
std::mutex gPendingMutex;
std::vector<PendingKernel> gPending;  // registered before the driver was loaded
bool gInitialised = false;            // guarded by gPendingMutex for registration

thread_local cudaError_t tLastError = cudaSuccess;
thread_local bool tContextCurrent = false;
thread_local int tDevice = 0;
thread_local uint32_t tCorrelationId = 0;
// Set by the _ptsz/_ptds entry points around the shared implementation: which driver
// variants to call, and which callback id to raise.
thread_local bool tPerThread = false;
thread_local CUpti_CallbackId tPerThreadCbid = 0;
thread_local const char* tPerThreadName = nullptr;

const DriverApi& api() { return tPerThread ? gApiPerThread : gApi; }

cudaError_t toRuntime(CUresult result) {
  // The runtime's codes equal the driver's for every error these calls can return
  // (e.g. CUDA_ERROR_OUT_OF_MEMORY = cudaErrorMemoryAllocation = 2).
  return static_cast<cudaError_t>(result);
}

void initialise() {
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    gInitError = cudaErrorInsufficientDriver;
    return;
  }
  auto getProc = reinterpret_cast<decltype(&cuGetProcAddress_v2)>(
      dlsym(handle, "cuGetProcAddress_v2"));
  if (getProc == nullptr) {
    gInitError = cudaErrorInsufficientDriver;
    return;
  }
  bool complete = true;
#define FETCH(name)                                                                          \
  if (getProc(baseName(#name).c_str(), reinterpret_cast<void**>(&gApi.name), kRuntimeVersion, \
              CU_GET_PROC_ADDRESS_DEFAULT, nullptr) != CUDA_SUCCESS ||                         \
      gApi.name == nullptr)                                                                    \
    complete = false;
  DRIVER_FUNCTIONS(FETCH)
#undef FETCH
#define FETCH_PER_THREAD(name)                                                                 \
  if (getProc(baseName(#name).c_str(), reinterpret_cast<void**>(&gApiPerThread.name),          \
              kRuntimeVersion, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, nullptr) !=        \
          CUDA_SUCCESS ||                                                                      \
      gApiPerThread.name == nullptr)                                                           \
    complete = false;
  DRIVER_FUNCTIONS(FETCH_PER_THREAD)
#undef FETCH_PER_THREAD
  if (!complete) {
    gInitError = cudaErrorInsufficientDriver;
    return;
  }
  const void* table = nullptr;
  if (gApi.cuGetExportTable(&table, &kExportTableId) != CUDA_SUCCESS ||
      static_cast<const ExportTable*>(table)->size != sizeof(ExportTable)) {
    // A driver that is not cudasim's: this runtime cannot drive it.
    std::fprintf(stderr, "cudasim: libcudart.so.13 (cudasim) loaded a libcuda.so.1 that is not "
                         "cudasim's; put the cudasim build directory first on the library path\n");
    gInitError = cudaErrorInsufficientDriver;
    return;
  }
  gTable = static_cast<const ExportTable*>(table);
  CUresult result = gApi.cuInit(0);
  if (result != CUDA_SUCCESS) {
    gInitError = result == CUDA_ERROR_NO_DEVICE ? cudaErrorNoDevice : toRuntime(result);
    return;
  }
  result = gApi.cuDevicePrimaryCtxRetain(&gPrimary, 0);
  if (result != CUDA_SUCCESS) {
    gInitError = toRuntime(result);
    return;
  }
  std::lock_guard lock(gPendingMutex);
  for (const PendingKernel& kernel : gPending)
    gTable->registerKernel(kernel.symbol, kernel.name.c_str(), kernel.body,
                           static_cast<int>(kernel.sizes.size()), kernel.sizes.data());
  gPending.clear();
  gInitialised = true;
  gCallbacks = gTable->callbacks;
}

// Loads the driver once, and makes the primary context current on this thread.
cudaError_t ready() {
  std::call_once(gInitOnce, initialise);
  if (gInitError != cudaSuccess) return gInitError;
  if (!tContextCurrent) {
    CUresult result = gApi.cuCtxSetCurrent(gPrimary);
    if (result != CUDA_SUCCESS) return toRuntime(result);
    tContextCurrent = true;
  }
  return cudaSuccess;
}

cudaError_t remember(cudaError_t error) {
  // cudaErrorNotReady reports a state, not a failure: it is not recorded.
  if (error != cudaSuccess && error != cudaErrorNotReady) tLastError = error;
  return error;
}

// Calls a driver function, telling the driver that it is this runtime call's own call
// (for the correlation id, and for CUDASIM_CUPTI_DRIVER_CALLBACKS=0).
template <class Function, class... Args>
cudaError_t drive(CUpti_CallbackId driverCbid, Function function, Args... args) {
  gTable->setRuntimeOrigin(RuntimeOrigin{driverCbid, tCorrelationId});
  CUresult result = function(args...);
  gTable->setRuntimeOrigin(RuntimeOrigin{});
  return toRuntime(result);
}
#define DRIVE(name, ...) drive(CUPTI_DRIVER_TRACE_CBID_##name, api().name, __VA_ARGS__)
#define DRIVE0(name) drive(CUPTI_DRIVER_TRACE_CBID_##name, api().name)

// The functionName CUPTI gives a runtime call: its name without the version its callback id
// carries ("cudaMalloc" for cudaMalloc_v3020; seen on an H200). Kept for the process.
const char* cuptiName(const char* versioned) {
  static std::mutex mutex;
  static std::unordered_map<const char*, std::string> names;
  std::lock_guard lock(mutex);
  auto [it, inserted] = names.try_emplace(versioned, versioned);
  if (inserted) {
    std::string& name = it->second;
    const size_t v = name.rfind("_v");
    if (v != std::string::npos && v + 2 < name.size() &&
        name.find_first_not_of("0123456789", v + 2) == std::string::npos)
      name.resize(v);
  }
  return it->second.c_str();
}

template <class Body>
cudaError_t runtimeCall(CUpti_CallbackId cbid, const char* name, const void* params,
                        const char* symbolName, bool needsDriver, Body&& body) {
  if (needsDriver) {
    if (cudaError_t error = ready()) return remember(error);
  }
  CallbackState* callbacks = gCallbacks;
  if (callbacks == nullptr) return remember(body());
  if (tPerThread && tPerThreadCbid != 0) {
    cbid = tPerThreadCbid;
    name = tPerThreadName;
  }
  const uint32_t outer = tCorrelationId;
  const bool subscribed = callbacks->subscriber.load(std::memory_order_acquire) != nullptr;
  // Inside another call (a runtime call's callback, say), as CUPTI does: that call's id.
  const uint32_t* active = callbacks->threadCorrelation ? callbacks->threadCorrelation() : nullptr;
  tCorrelationId = !subscribed                  ? 0
                   : active != nullptr && *active ? *active
                                                  : callbacks->nextCorrelationId.fetch_add(1);
  cudaError_t result = invokeWithCallbacks<cudaError_t>(
      *callbacks, CallSite{CUPTI_CB_DOMAIN_RUNTIME_API, cbid, subscribed ? cuptiName(name) : name},
      params, symbolName,
      needsDriver ? gPrimary : nullptr, tCorrelationId, body);
  tCorrelationId = outer;
  return remember(result);
}

#define RUNTIME_CALL(name, body, ...)                                                          \
  name##_params params_{__VA_ARGS__};                                                           \
  return runtimeCall(CUPTI_RUNTIME_TRACE_CBID_##name, #name, &params_, nullptr, true,          \
                     [&]() -> cudaError_t body)
#define RUNTIME_CALL_NOARGS(name, body)                                                        \
  return runtimeCall(CUPTI_RUNTIME_TRACE_CBID_##name, #name, nullptr, nullptr, true,          \
                     [&]() -> cudaError_t body)

CUstream driverStream(cudaStream_t stream) { return reinterpret_cast<CUstream>(stream); }

// The function a kernel symbol (a host stub) stands for.
cudaError_t functionForStub(const void* symbol, CUfunction* function) {
  if (gTable->functionForSymbol(symbol, function) != CUDA_SUCCESS)
    return cudaErrorInvalidDeviceFunction;
  return cudaSuccess;
}

// What the launch and cudaFunc* calls take: a stub, or a cudaKernel_t cast to a pointer (as
// the real runtime documents; CUDA 13's <<<>>> launches pass one). A launch of neither fails as
// a bad handle (seen on an H200).
cudaError_t functionFor(const void* func, CUfunction* function,
                        cudaError_t unknown = cudaErrorInvalidDeviceFunction, bool load = true) {
  if (functionForStub(func, function) == cudaSuccess) return cudaSuccess;
  if (gTable->functionForKernel(reinterpret_cast<CUkernel>(const_cast<void*>(func)), function,
                                load) == CUDA_SUCCESS)
    return cudaSuccess;
  return unknown;
}

// The name CUPTI reports for a launch: asked before the launch, so it loads nothing (a kernel
// handle's function is still not loaded at the launch's API_ENTER, as on the H200).
const char* kernelNameFor(const void* symbol) {
  CUfunction function;
  const char* name = nullptr;
  if (gTable == nullptr ||
      functionFor(symbol, &function, cudaErrorInvalidDeviceFunction, false) != cudaSuccess)
    return nullptr;
  gApi.cuFuncGetName(&name, function);
  return name;
}

#include "result_names.inc"

const char* describe(cudaError_t error, bool wantName) {
  switch (static_cast<int>(error)) {
#define CUDASIM_DESCRIBE(value, name, description) \
  case value:                                     \
    return wantName ? name : description;
    CUDASIM_RUNTIME_RESULTS(CUDASIM_DESCRIBE)
#undef CUDASIM_DESCRIBE
  }
  return wantName ? "cudaErrorUnknown" : "unrecognized error code";
}

cudaError_t copyKind(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                     cudaStream_t stream, bool async) {
  const auto d = reinterpret_cast<CUdeviceptr>(dst);
  const auto s = reinterpret_cast<CUdeviceptr>(src);
  const CUstream cs = driverStream(stream);
  switch (kind) {
    case cudaMemcpyHostToDevice:
      return async ? DRIVE(cuMemcpyHtoDAsync_v2, d, src, count, cs)
                   : DRIVE(cuMemcpyHtoD_v2, d, src, count);
    case cudaMemcpyDeviceToHost:
      return async ? DRIVE(cuMemcpyDtoHAsync_v2, dst, s, count, cs)
                   : DRIVE(cuMemcpyDtoH_v2, dst, s, count);
    case cudaMemcpyDeviceToDevice:
      return async ? DRIVE(cuMemcpyDtoDAsync_v2, d, s, count, cs)
                   : DRIVE(cuMemcpyDtoD_v2, d, s, count);
    case cudaMemcpyHostToHost:
    case cudaMemcpyDefault:
      return async ? DRIVE(cuMemcpyAsync, d, s, count, cs) : DRIVE(cuMemcpy, d, s, count);
  }
  return cudaErrorInvalidMemcpyDirection;
}

// What CU_DEVICE_ATTRIBUTE_MAX_PITCH says.
constexpr size_t kMaxPitch = 2147483647;

cudaError_t copy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                   size_t height, cudaMemcpyKind kind, cudaStream_t stream, bool async) {
  if (dpitch < width || spitch < width || dpitch > kMaxPitch || spitch > kMaxPitch)
    return cudaErrorInvalidPitchValue;
  CUmemorytype dstType, srcType;
  switch (kind) {
    case cudaMemcpyHostToHost: dstType = srcType = CU_MEMORYTYPE_HOST; break;
    case cudaMemcpyHostToDevice: srcType = CU_MEMORYTYPE_HOST, dstType = CU_MEMORYTYPE_DEVICE; break;
    case cudaMemcpyDeviceToHost: srcType = CU_MEMORYTYPE_DEVICE, dstType = CU_MEMORYTYPE_HOST; break;
    case cudaMemcpyDeviceToDevice: dstType = srcType = CU_MEMORYTYPE_DEVICE; break;
    case cudaMemcpyDefault: dstType = srcType = CU_MEMORYTYPE_UNIFIED; break;
    default: return cudaErrorInvalidMemcpyDirection;
  }
  CUDA_MEMCPY2D p{};
  p.srcMemoryType = srcType;
  p.srcHost = src;
  p.srcDevice = reinterpret_cast<CUdeviceptr>(src);
  p.srcPitch = spitch;
  p.dstMemoryType = dstType;
  p.dstHost = dst;
  p.dstDevice = reinterpret_cast<CUdeviceptr>(dst);
  p.dstPitch = dpitch;
  p.WidthInBytes = width;
  p.Height = height;
  return async ? DRIVE(cuMemcpy2DAsync_v2, &p, driverStream(stream)) : DRIVE(cuMemcpy2D_v2, &p);
}

// The runtime's pool types are the driver's, by value and layout.
static_assert(sizeof(cudaMemPoolProps) == sizeof(CUmemPoolProps));
static_assert(sizeof(cudaMemAccessDesc) == sizeof(CUmemAccessDesc));
static_assert(sizeof(cudaMemLocation) == sizeof(CUmemLocation));
static_assert(int(cudaMemPoolAttrUsedMemHigh) == int(CU_MEMPOOL_ATTR_USED_MEM_HIGH));
CUmemoryPool driverPool(cudaMemPool_t pool) { return reinterpret_cast<CUmemoryPool>(pool); }

}  // namespace
}  // namespace cudasim

using namespace cudasim;

extern "C" {

void cudasimRegisterKernel(const void* symbol, const char* name,
                           void (*body)(void** params, dim3 grid, dim3 block), int paramCount,
                           const size_t* paramSizes) {
  {
    std::lock_guard lock(gPendingMutex);
    if (!gInitialised) {
      // Programs register at start-up; the driver is loaded on the first runtime call.
      gPending.push_back(PendingKernel{symbol, name ? name : "", body,
                                       std::vector<size_t>(paramSizes, paramSizes + paramCount)});
      return;
    }
  }
  gTable->registerKernel(symbol, name, body, paramCount, paramSizes);
}

const char* cudasimSetFaults(const char* spec) {
  std::call_once(gInitOnce, initialise);
  if (gTable == nullptr) return "the cudasim driver could not be loaded";
  return gTable->setFaults(spec);
}

void cudasimKernelTime(int64_t nanoseconds) {
  // Called from kernel bodies, on the driver's stream workers: the driver is loaded by then.
  std::call_once(gInitOnce, initialise);
  if (gTable != nullptr) gTable->kernelTime(nanoseconds);
}

uint64_t cudasimTimingOverruns() {
  std::call_once(gInitOnce, initialise);
  return gTable != nullptr ? gTable->timingOverruns() : 0;
}

int64_t cudasimTimingOverrunNs() {
  std::call_once(gInitOnce, initialise);
  return gTable != nullptr ? gTable->timingOverrunNs() : 0;
}

// ---- errors and versions --------------------------------------------------------------

cudaError_t CUDARTAPI cudaGetLastError(void) {
  cudaError_t error = tLastError;
  tLastError = cudaSuccess;
  return error;
}

cudaError_t CUDARTAPI cudaPeekAtLastError(void) { return tLastError; }

const char* CUDARTAPI cudaGetErrorString(cudaError_t error) { return describe(error, false); }
const char* CUDARTAPI cudaGetErrorName(cudaError_t error) { return describe(error, true); }

cudaError_t CUDARTAPI cudaRuntimeGetVersion(int* runtimeVersion) {
  if (runtimeVersion == nullptr) return remember(cudaErrorInvalidValue);
  *runtimeVersion = kRuntimeVersion;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDriverGetVersion(int* driverVersion) {
  if (driverVersion == nullptr) return remember(cudaErrorInvalidValue);
  std::call_once(gInitOnce, initialise);
  // Without a driver the answer is 0, not an error.
  *driverVersion = 0;
  if (gApi.cuDriverGetVersion != nullptr) gApi.cuDriverGetVersion(driverVersion);
  return cudaSuccess;
}

// ---- devices ----------------------------------------------------------------------------

cudaError_t CUDARTAPI cudaGetDeviceCount(int* count) {
  if (count == nullptr) return remember(cudaErrorInvalidValue);
  *count = 0;
  RUNTIME_CALL(cudaGetDeviceCount_v3020, { return DRIVE(cuDeviceGetCount, count); }, count);
}

cudaError_t CUDARTAPI cudaSetDevice(int device) {
  RUNTIME_CALL(cudaSetDevice_v3020, {
    int count = 0;
    gApi.cuDeviceGetCount(&count);
    if (device < 0 || device >= count) return cudaErrorInvalidDevice;
    tDevice = device;
    return cudaSuccess;
  }, device);
}

cudaError_t CUDARTAPI cudaGetDevice(int* device) {
  RUNTIME_CALL(cudaGetDevice_v3020, {
    if (device == nullptr) return cudaErrorInvalidValue;
    *device = tDevice;
    return cudaSuccess;
  }, device);
}

cudaError_t CUDARTAPI cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  RUNTIME_CALL(cudaDeviceGetAttribute_v5000, {
    // The runtime's attribute numbers are the driver's.
    return DRIVE(cuDeviceGetAttribute, value, static_cast<CUdevice_attribute>(attr), device);
  }, value, attr, device);
}

cudaError_t CUDARTAPI cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  RUNTIME_CALL(cudaGetDeviceProperties_v12000, {
    if (prop == nullptr) return cudaErrorInvalidValue;
    std::memset(prop, 0, sizeof(*prop));
    if (cudaError_t e = DRIVE(cuDeviceGetName, prop->name, int(sizeof(prop->name)), device))
      return e;
    size_t total = 0;
    DRIVE(cuDeviceTotalMem_v2, &total, device);
    prop->totalGlobalMem = total;
    auto attribute = [device](CUdevice_attribute a) {
      int v = 0;
      gApi.cuDeviceGetAttribute(&v, a, device);
      return v;
    };
    prop->major = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    prop->minor = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    prop->multiProcessorCount = attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    prop->maxThreadsPerBlock = attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
    prop->warpSize = attribute(CU_DEVICE_ATTRIBUTE_WARP_SIZE);
    prop->sharedMemPerBlock = attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
    prop->maxThreadsDim[0] = attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X);
    prop->maxThreadsDim[1] = attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y);
    prop->maxThreadsDim[2] = attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z);
    prop->maxGridSize[0] = attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X);
    prop->maxGridSize[1] = attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y);
    prop->maxGridSize[2] = attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z);
    prop->unifiedAddressing = attribute(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING);
    prop->asyncEngineCount = attribute(CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT);
    prop->concurrentKernels = attribute(CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS);
    prop->canMapHostMemory = attribute(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY);
    prop->memoryBusWidth = attribute(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
    return cudaSuccess;
  }, prop, device);
}

cudaError_t CUDARTAPI cudaDeviceSynchronize(void) {
  RUNTIME_CALL_NOARGS(cudaDeviceSynchronize_v3020, { return DRIVE0(cuCtxSynchronize); });
}

cudaError_t CUDARTAPI cudaMemGetInfo(size_t* free, size_t* total) {
  RUNTIME_CALL(cudaMemGetInfo_v3020, { return DRIVE(cuMemGetInfo_v2, free, total); }, free, total);
}

// ---- memory -----------------------------------------------------------------------------

cudaError_t CUDARTAPI cudaMalloc(void** devPtr, size_t size) {
  RUNTIME_CALL(cudaMalloc_v3020, {
    if (devPtr == nullptr) return cudaErrorInvalidValue;
    if (size == 0) {
      *devPtr = nullptr;  // as the real runtime does
      return cudaSuccess;
    }
    CUdeviceptr address = 0;
    cudaError_t error = DRIVE(cuMemAlloc_v2, &address, size);
    *devPtr = error == cudaSuccess ? reinterpret_cast<void*>(address) : nullptr;
    return error;
  }, devPtr, size);
}

cudaError_t CUDARTAPI cudaFree(void* devPtr) {
  RUNTIME_CALL(cudaFree_v3020, {
    if (devPtr == nullptr) return cudaSuccess;
    return DRIVE(cuMemFree_v2, reinterpret_cast<CUdeviceptr>(devPtr));
  }, devPtr);
}

cudaError_t CUDARTAPI cudaMallocPitch(void** devPtr, size_t* pitch, size_t width, size_t height) {
  RUNTIME_CALL(cudaMallocPitch_v3020, {
    if (devPtr == nullptr || pitch == nullptr) return cudaErrorInvalidValue;
    CUdeviceptr address = 0;
    cudaError_t error = DRIVE(cuMemAllocPitch_v2, &address, pitch, width, height, 4u);
    *devPtr = error == cudaSuccess ? reinterpret_cast<void*>(address) : nullptr;
    return error;
  }, devPtr, pitch, width, height);
}

cudaError_t CUDARTAPI cudaMalloc3D(cudaPitchedPtr* pitchedDevPtr, cudaExtent extent) {
  RUNTIME_CALL(cudaMalloc3D_v3020, {
    if (pitchedDevPtr == nullptr) return cudaErrorInvalidValue;
    // Each of the depth slices is height pitched rows: one pitched allocation of all the rows.
    if (extent.depth != 0 && extent.height > SIZE_MAX / extent.depth) return cudaErrorInvalidValue;
    CUdeviceptr address = 0;
    size_t pitch = 0;
    cudaError_t error = DRIVE(cuMemAllocPitch_v2, &address, &pitch, extent.width,
                              extent.height * extent.depth, 4u);
    if (error != cudaSuccess) return error;
    pitchedDevPtr->ptr = reinterpret_cast<void*>(address);
    pitchedDevPtr->pitch = pitch;
    pitchedDevPtr->xsize = extent.width;
    pitchedDevPtr->ysize = extent.height;
    return cudaSuccess;
  }, pitchedDevPtr, extent);
}

cudaError_t CUDARTAPI cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch,
                                   size_t width, size_t height, cudaMemcpyKind kind) {
  RUNTIME_CALL(cudaMemcpy2D_v3020, {
    return copy2D(dst, dpitch, src, spitch, width, height, kind, nullptr, false);
  }, dst, dpitch, src, spitch, width, height, kind);
}

cudaError_t CUDARTAPI cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                                        size_t width, size_t height, cudaMemcpyKind kind,
                                        cudaStream_t stream) {
  RUNTIME_CALL(cudaMemcpy2DAsync_v3020, {
    return copy2D(dst, dpitch, src, spitch, width, height, kind, stream, true);
  }, dst, dpitch, src, spitch, width, height, kind, stream);
}

// ---- stream-ordered allocation and memory pools -----------------------------------------

cudaError_t CUDARTAPI cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream) {
  RUNTIME_CALL(cudaMallocAsync_v11020, {
    if (devPtr == nullptr) return cudaErrorInvalidValue;
    CUdeviceptr address = 0;
    cudaError_t error = DRIVE(cuMemAllocAsync, &address, size, driverStream(hStream));
    *devPtr = error == cudaSuccess ? reinterpret_cast<void*>(address) : nullptr;
    return error;
  }, devPtr, size, hStream);
}

cudaError_t CUDARTAPI cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t memPool,
                                              cudaStream_t stream) {
  RUNTIME_CALL(cudaMallocFromPoolAsync_v11020, {
    if (ptr == nullptr) return cudaErrorInvalidValue;
    CUdeviceptr address = 0;
    cudaError_t error = DRIVE(cuMemAllocFromPoolAsync, &address, size, driverPool(memPool),
                              driverStream(stream));
    *ptr = error == cudaSuccess ? reinterpret_cast<void*>(address) : nullptr;
    return error;
  }, ptr, size, memPool, stream);
}

cudaError_t CUDARTAPI cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
  RUNTIME_CALL(cudaFreeAsync_v11020, {
    return DRIVE(cuMemFreeAsync, reinterpret_cast<CUdeviceptr>(devPtr), driverStream(hStream));
  }, devPtr, hStream);
}

cudaError_t CUDARTAPI cudaMemPoolCreate(cudaMemPool_t* memPool, const cudaMemPoolProps* poolProps) {
  RUNTIME_CALL(cudaMemPoolCreate_v11020, {
    return DRIVE(cuMemPoolCreate, reinterpret_cast<CUmemoryPool*>(memPool),
                 reinterpret_cast<const CUmemPoolProps*>(poolProps));
  }, memPool, poolProps);
}

cudaError_t CUDARTAPI cudaMemPoolDestroy(cudaMemPool_t memPool) {
  RUNTIME_CALL(cudaMemPoolDestroy_v11020, { return DRIVE(cuMemPoolDestroy, driverPool(memPool)); }, memPool);
}

cudaError_t CUDARTAPI cudaMemPoolSetAttribute(cudaMemPool_t memPool, cudaMemPoolAttr attr, void* value) {
  RUNTIME_CALL(cudaMemPoolSetAttribute_v11020, {
    return DRIVE(cuMemPoolSetAttribute, driverPool(memPool), static_cast<CUmemPool_attribute>(attr), value);
  }, memPool, attr, value);
}

cudaError_t CUDARTAPI cudaMemPoolGetAttribute(cudaMemPool_t memPool, cudaMemPoolAttr attr, void* value) {
  RUNTIME_CALL(cudaMemPoolGetAttribute_v11020, {
    return DRIVE(cuMemPoolGetAttribute, driverPool(memPool), static_cast<CUmemPool_attribute>(attr), value);
  }, memPool, attr, value);
}

cudaError_t CUDARTAPI cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep) {
  RUNTIME_CALL(cudaMemPoolTrimTo_v11020, {
    return DRIVE(cuMemPoolTrimTo, driverPool(memPool), minBytesToKeep);
  }, memPool, minBytesToKeep);
}

cudaError_t CUDARTAPI cudaMemPoolSetAccess(cudaMemPool_t memPool, const cudaMemAccessDesc* descList,
                                           size_t count) {
  RUNTIME_CALL(cudaMemPoolSetAccess_v11020, {
    return DRIVE(cuMemPoolSetAccess, driverPool(memPool),
                 reinterpret_cast<const CUmemAccessDesc*>(descList), count);
  }, memPool, descList, count);
}

cudaError_t CUDARTAPI cudaMemPoolGetAccess(cudaMemAccessFlags* flags, cudaMemPool_t memPool,
                                           cudaMemLocation* location) {
  RUNTIME_CALL(cudaMemPoolGetAccess_v11020, {
    return DRIVE(cuMemPoolGetAccess, reinterpret_cast<CUmemAccess_flags*>(flags), driverPool(memPool),
                 reinterpret_cast<CUmemLocation*>(location));
  }, flags, memPool, location);
}

cudaError_t CUDARTAPI cudaDeviceGetDefaultMemPool(cudaMemPool_t* memPool, int device) {
  RUNTIME_CALL(cudaDeviceGetDefaultMemPool_v11020, {
    return DRIVE(cuDeviceGetDefaultMemPool, reinterpret_cast<CUmemoryPool*>(memPool), device);
  }, memPool, device);
}

cudaError_t CUDARTAPI cudaDeviceGetMemPool(cudaMemPool_t* memPool, int device) {
  RUNTIME_CALL(cudaDeviceGetMemPool_v11020, {
    return DRIVE(cuDeviceGetMemPool, reinterpret_cast<CUmemoryPool*>(memPool), device);
  }, memPool, device);
}

cudaError_t CUDARTAPI cudaDeviceSetMemPool(int device, cudaMemPool_t memPool) {
  RUNTIME_CALL(cudaDeviceSetMemPool_v11020, {
    return DRIVE(cuDeviceSetMemPool, device, driverPool(memPool));
  }, device, memPool);
}

cudaError_t CUDARTAPI cudaMallocHost(void** ptr, size_t size) {
  RUNTIME_CALL(cudaMallocHost_v3020, { return DRIVE(cuMemAllocHost_v2, ptr, size); }, ptr, size);
}

cudaError_t CUDARTAPI cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
  RUNTIME_CALL(cudaHostAlloc_v3020, { return DRIVE(cuMemHostAlloc, pHost, size, flags); }, pHost, size, flags);
}

cudaError_t CUDARTAPI cudaFreeHost(void* ptr) {
  RUNTIME_CALL(cudaFreeHost_v3020, { return DRIVE(cuMemFreeHost, ptr); }, ptr);
}

cudaError_t CUDARTAPI cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  RUNTIME_CALL(cudaHostRegister_v4000, { return DRIVE(cuMemHostRegister_v2, ptr, size, flags); }, ptr, size, flags);
}

cudaError_t CUDARTAPI cudaHostUnregister(void* ptr) {
  RUNTIME_CALL(cudaHostUnregister_v4000, { return DRIVE(cuMemHostUnregister, ptr); }, ptr);
}

cudaError_t CUDARTAPI cudaHostGetDevicePointer(void** pDevice, void* pHost, unsigned int flags) {
  RUNTIME_CALL(cudaHostGetDevicePointer_v3020, {
    return DRIVE(cuMemHostGetDevicePointer_v2, reinterpret_cast<CUdeviceptr*>(pDevice), pHost, flags);
  }, pDevice, pHost, flags);
}

cudaError_t CUDARTAPI cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  RUNTIME_CALL(cudaMemcpy_v3020, { return copyKind(dst, src, count, kind, nullptr, false); },
               dst, src, count, kind);
}

cudaError_t CUDARTAPI cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                                      cudaStream_t stream) {
  RUNTIME_CALL(cudaMemcpyAsync_v3020, { return copyKind(dst, src, count, kind, stream, true); },
               dst, src, count, kind, stream);
}

cudaError_t CUDARTAPI cudaMemset(void* devPtr, int value, size_t count) {
  RUNTIME_CALL(cudaMemset_v3020, {
    return DRIVE(cuMemsetD8_v2, reinterpret_cast<CUdeviceptr>(devPtr),
                 static_cast<unsigned char>(value), count);
  }, devPtr, value, count);
}

cudaError_t CUDARTAPI cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  RUNTIME_CALL(cudaMemsetAsync_v3020, {
    return DRIVE(cuMemsetD8Async, reinterpret_cast<CUdeviceptr>(devPtr),
                 static_cast<unsigned char>(value), count, driverStream(stream));
  }, devPtr, value, count, stream);
}

// ---- streams and events ---------------------------------------------------------------

cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t* pStream) {
  RUNTIME_CALL(cudaStreamCreate_v3020, {
    return DRIVE(cuStreamCreate, reinterpret_cast<CUstream*>(pStream), 0u);
  }, pStream);
}

cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  RUNTIME_CALL(cudaStreamCreateWithFlags_v5000, {
    return DRIVE(cuStreamCreate, reinterpret_cast<CUstream*>(pStream), flags);
  }, pStream, flags);
}

cudaError_t CUDARTAPI cudaStreamCreateWithPriority(cudaStream_t* pStream, unsigned int flags,
                                                   int priority) {
  RUNTIME_CALL(cudaStreamCreateWithPriority_v5050, {
    return DRIVE(cuStreamCreateWithPriority, reinterpret_cast<CUstream*>(pStream), flags, priority);
  }, pStream, flags, priority);
}

cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream) {
  RUNTIME_CALL(cudaStreamDestroy_v5050, { return DRIVE(cuStreamDestroy_v2, driverStream(stream)); }, stream);
}

cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t stream) {
  RUNTIME_CALL(cudaStreamSynchronize_v3020, { return DRIVE(cuStreamSynchronize, driverStream(stream)); }, stream);
}

cudaError_t CUDARTAPI cudaStreamQuery(cudaStream_t stream) {
  RUNTIME_CALL(cudaStreamQuery_v3020, { return DRIVE(cuStreamQuery, driverStream(stream)); }, stream);
}

cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  RUNTIME_CALL(cudaStreamWaitEvent_v3020, {
    return DRIVE(cuStreamWaitEvent, driverStream(stream), reinterpret_cast<CUevent>(event), flags);
  }, stream, event, flags);
}

cudaError_t CUDARTAPI cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  RUNTIME_CALL(cudaLaunchHostFunc_v10000, {
    return DRIVE(cuLaunchHostFunc, driverStream(stream), fn, userData);
  }, stream, fn, userData);
}

cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t* event) {
  RUNTIME_CALL(cudaEventCreate_v3020, {
    return DRIVE(cuEventCreate, reinterpret_cast<CUevent*>(event), 0u);
  }, event);
}

cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  RUNTIME_CALL(cudaEventCreateWithFlags_v3020, {
    return DRIVE(cuEventCreate, reinterpret_cast<CUevent*>(event), flags);
  }, event, flags);
}

cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event) {
  RUNTIME_CALL(cudaEventDestroy_v3020, { return DRIVE(cuEventDestroy_v2, reinterpret_cast<CUevent>(event)); }, event);
}

cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  RUNTIME_CALL(cudaEventRecord_v3020, {
    return DRIVE(cuEventRecord, reinterpret_cast<CUevent>(event), driverStream(stream));
  }, event, stream);
}

cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t event) {
  RUNTIME_CALL(cudaEventQuery_v3020, { return DRIVE(cuEventQuery, reinterpret_cast<CUevent>(event)); }, event);
}

cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t event) {
  RUNTIME_CALL(cudaEventSynchronize_v3020, { return DRIVE(cuEventSynchronize, reinterpret_cast<CUevent>(event)); }, event);
}

cudaError_t CUDARTAPI cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  RUNTIME_CALL(cudaEventElapsedTime_v12080, {
    return DRIVE(cuEventElapsedTime_v2, ms, reinterpret_cast<CUevent>(start), reinterpret_cast<CUevent>(end));
  }, ms, start, end);
}

// ---- kernels ----------------------------------------------------------------------------

cudaError_t CUDARTAPI cudaLaunchKernel(const void* func, dim3 gridDim, dim3 blockDim, void** args,
                                       size_t sharedMem, cudaStream_t stream) {
  cudaLaunchKernel_v7000_params params{func, gridDim, blockDim, args, sharedMem, stream};
  if (cudaError_t error = ready()) return remember(error);
  return runtimeCall(CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000, "cudaLaunchKernel_v7000",
                     &params, kernelNameFor(func), true, [&]() -> cudaError_t {
                       CUfunction function;
                       if (cudaError_t error =
                               functionFor(func, &function, cudaErrorInvalidResourceHandle))
                         return error;
                       return DRIVE(cuLaunchKernel, function, gridDim.x, gridDim.y, gridDim.z,
                                    blockDim.x, blockDim.y, blockDim.z,
                                    static_cast<unsigned>(sharedMem), driverStream(stream), args,
                                    nullptr);
                     });
}

cudaError_t CUDARTAPI cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func,
                                          void** args) {
  cudaLaunchKernelExC_v11060_params params{config, func, args};
  if (cudaError_t error = ready()) return remember(error);
  return runtimeCall(CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060, "cudaLaunchKernelExC_v11060",
                     &params, kernelNameFor(func), true, [&]() -> cudaError_t {
                       if (config == nullptr) return cudaErrorInvalidValue;
                       CUfunction function;
                       if (cudaError_t error =
                               functionFor(func, &function, cudaErrorInvalidResourceHandle))
                         return error;
                       CUlaunchConfig driverConfig{};
                       driverConfig.gridDimX = config->gridDim.x;
                       driverConfig.gridDimY = config->gridDim.y;
                       driverConfig.gridDimZ = config->gridDim.z;
                       driverConfig.blockDimX = config->blockDim.x;
                       driverConfig.blockDimY = config->blockDim.y;
                       driverConfig.blockDimZ = config->blockDim.z;
                       driverConfig.sharedMemBytes = static_cast<unsigned>(config->dynamicSmemBytes);
                       driverConfig.hStream = driverStream(config->stream);
                       return DRIVE(cuLaunchKernelEx, &driverConfig, function, args, nullptr);
                     });
}

// Stubs only: given a cudaKernel_t it fails with cudaErrorInvalidDeviceFunction, as the real
// runtime does (seen on an H200, CUDA 13.0).
cudaError_t CUDARTAPI cudaGetFuncBySymbol(cudaFunction_t* functionPtr, const void* symbolPtr) {
  RUNTIME_CALL(cudaGetFuncBySymbol_v11000, {
    if (functionPtr == nullptr) return cudaErrorInvalidValue;
    if (gTable->foreignStubs()) return cudaErrorInvalidDeviceFunction;
    return functionForStub(symbolPtr, reinterpret_cast<CUfunction*>(functionPtr));
  }, functionPtr, symbolPtr);
}

cudaError_t CUDARTAPI cudaGetKernel(cudaKernel_t* kernelPtr, const void* entryFuncAddr) {
  RUNTIME_CALL(cudaGetKernel_v12000, {
    if (kernelPtr == nullptr) return cudaErrorInvalidValue;
    if (gTable->kernelForSymbol(entryFuncAddr, reinterpret_cast<CUkernel*>(kernelPtr)) !=
        CUDA_SUCCESS)
      return cudaErrorInvalidDeviceFunction;
    return cudaSuccess;
  }, kernelPtr, entryFuncAddr);
}

// What nvcc 13's stubs call: once per kernel, then one launch per <<<>>>.
cudaError_t CUDARTAPI __cudaGetKernel(cudaKernel_t* kernelPtr, const void* entryFuncAddr) {
  return cudaGetKernel(kernelPtr, entryFuncAddr);
}

// The real runtime (13.0) reports these launches to CUPTI as cudaLaunchKernel, its `func`
// the kernel handle (seen on an H200).
cudaError_t CUDARTAPI __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                         void** args, size_t sharedMem, cudaStream_t stream) {
  return cudaLaunchKernel(reinterpret_cast<const void*>(kernel), gridDim, blockDim, args,
                          sharedMem, stream);
}

cudaError_t CUDARTAPI cudaFuncGetParamInfo(const void* func, size_t paramIndex, size_t* paramOffset,
                                           size_t* paramSize) {
  RUNTIME_CALL(cudaFuncGetParamInfo_v12040, {
    CUfunction function;
    if (cudaError_t error = functionFor(func, &function)) return error;
    return DRIVE(cuFuncGetParamInfo, function, paramIndex, paramOffset, paramSize);
  }, func, paramIndex, paramOffset, paramSize);
}

cudaError_t CUDARTAPI cudaFuncGetName(const char** name, const void* func) {
  RUNTIME_CALL(cudaFuncGetName_v12030, {
    if (name == nullptr) return cudaErrorInvalidValue;
    CUfunction function;
    if (cudaError_t error = functionFor(func, &function)) return error;
    return DRIVE(cuFuncGetName, name, function);
  }, name, func);
}

// ---- IPC and driver entry points --------------------------------------------------------

cudaError_t CUDARTAPI cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* devPtr) {
  static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(CUipcMemHandle));
  RUNTIME_CALL(cudaIpcGetMemHandle_v4010, {
    return DRIVE(cuIpcGetMemHandle, reinterpret_cast<CUipcMemHandle*>(handle),
                 reinterpret_cast<CUdeviceptr>(devPtr));
  }, handle, devPtr);
}

cudaError_t CUDARTAPI cudaIpcOpenMemHandle(void** devPtr, cudaIpcMemHandle_t handle, unsigned int flags) {
  RUNTIME_CALL(cudaIpcOpenMemHandle_v4010, {
    CUipcMemHandle driverHandle;
    std::memcpy(&driverHandle, &handle, sizeof(driverHandle));
    return DRIVE(cuIpcOpenMemHandle_v2, reinterpret_cast<CUdeviceptr*>(devPtr), driverHandle, flags);
  }, devPtr, handle, flags);
}

cudaError_t CUDARTAPI cudaIpcCloseMemHandle(void* devPtr) {
  RUNTIME_CALL(cudaIpcCloseMemHandle_v4010, {
    return DRIVE(cuIpcCloseMemHandle, reinterpret_cast<CUdeviceptr>(devPtr));
  }, devPtr);
}

cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr,
                                                       unsigned int cudaVersion,
                                                       unsigned long long flags,
                                                       cudaDriverEntryPointQueryResult* driverStatus) {
  RUNTIME_CALL(cudaGetDriverEntryPointByVersion_v12050, {
    CUdriverProcAddressQueryResult status;
    cudaError_t error = DRIVE(cuGetProcAddress_v2, symbol, funcPtr, static_cast<int>(cudaVersion),
                              flags, &status);
    if (driverStatus) *driverStatus = static_cast<cudaDriverEntryPointQueryResult>(status);
    return error;
  }, symbol, funcPtr, cudaVersion, flags, driverStatus);
}

cudaError_t CUDARTAPI cudaGetDriverEntryPoint(const char* symbol, void** funcPtr,
                                              unsigned long long flags,
                                              cudaDriverEntryPointQueryResult* driverStatus) {
  RUNTIME_CALL(cudaGetDriverEntryPoint_v11030, {
    CUdriverProcAddressQueryResult status;
    cudaError_t error = DRIVE(cuGetProcAddress_v2, symbol, funcPtr, kRuntimeVersion, flags, &status);
    if (driverStatus) *driverStatus = static_cast<cudaDriverEntryPointQueryResult>(status);
    return error;
  }, symbol, funcPtr, flags, driverStatus);
}

// ---- per-thread default stream variants (programs built with --default-stream per-thread)

}  // extern "C"

namespace cudasim {
namespace {

template <class Call>
cudaError_t perThread(CUpti_CallbackId cbid, const char* name, Call&& call) {
  tPerThread = true;
  tPerThreadCbid = cbid;
  tPerThreadName = name;
  cudaError_t result = call();
  tPerThread = false;
  tPerThreadCbid = 0;
  tPerThreadName = nullptr;
  return result;
}

}  // namespace
}  // namespace cudasim

#define PER_THREAD(name, call) \
  return perThread(CUPTI_RUNTIME_TRACE_CBID_##name, #name, [&] { return call; })

extern "C" {

cudaError_t CUDARTAPI cudaMemcpy_ptds(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  PER_THREAD(cudaMemcpy_ptds_v7000, cudaMemcpy(dst, src, count, kind));
}
cudaError_t CUDARTAPI cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t count,
                                           cudaMemcpyKind kind, cudaStream_t stream) {
  PER_THREAD(cudaMemcpyAsync_ptsz_v7000, cudaMemcpyAsync(dst, src, count, kind, stream));
}
cudaError_t CUDARTAPI cudaMemcpy2D_ptds(void* dst, size_t dpitch, const void* src, size_t spitch,
                                        size_t width, size_t height, cudaMemcpyKind kind) {
  PER_THREAD(cudaMemcpy2D_ptds_v7000, cudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind));
}
cudaError_t CUDARTAPI cudaMemcpy2DAsync_ptsz(void* dst, size_t dpitch, const void* src,
                                             size_t spitch, size_t width, size_t height,
                                             cudaMemcpyKind kind, cudaStream_t stream) {
  PER_THREAD(cudaMemcpy2DAsync_ptsz_v7000,
             cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, stream));
}
cudaError_t CUDARTAPI cudaMallocAsync_ptsz(void** devPtr, size_t size, cudaStream_t hStream) {
  PER_THREAD(cudaMallocAsync_ptsz_v11020, cudaMallocAsync(devPtr, size, hStream));
}
cudaError_t CUDARTAPI cudaMallocFromPoolAsync_ptsz(void** ptr, size_t size, cudaMemPool_t memPool,
                                                   cudaStream_t stream) {
  PER_THREAD(cudaMallocFromPoolAsync_ptsz_v11020, cudaMallocFromPoolAsync(ptr, size, memPool, stream));
}
cudaError_t CUDARTAPI cudaFreeAsync_ptsz(void* devPtr, cudaStream_t hStream) {
  PER_THREAD(cudaFreeAsync_ptsz_v11020, cudaFreeAsync(devPtr, hStream));
}
cudaError_t CUDARTAPI cudaMemset_ptds(void* devPtr, int value, size_t count) {
  PER_THREAD(cudaMemset_ptds_v7000, cudaMemset(devPtr, value, count));
}
cudaError_t CUDARTAPI cudaMemsetAsync_ptsz(void* devPtr, int value, size_t count, cudaStream_t stream) {
  PER_THREAD(cudaMemsetAsync_ptsz_v7000, cudaMemsetAsync(devPtr, value, count, stream));
}
cudaError_t CUDARTAPI cudaStreamSynchronize_ptsz(cudaStream_t stream) {
  PER_THREAD(cudaStreamSynchronize_ptsz_v7000, cudaStreamSynchronize(stream));
}
cudaError_t CUDARTAPI cudaStreamQuery_ptsz(cudaStream_t stream) {
  PER_THREAD(cudaStreamQuery_ptsz_v7000, cudaStreamQuery(stream));
}
cudaError_t CUDARTAPI cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  PER_THREAD(cudaStreamWaitEvent_ptsz_v7000, cudaStreamWaitEvent(stream, event, flags));
}
cudaError_t CUDARTAPI cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream) {
  PER_THREAD(cudaEventRecord_ptsz_v7000, cudaEventRecord(event, stream));
}
cudaError_t CUDARTAPI cudaLaunchHostFunc_ptsz(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  PER_THREAD(cudaLaunchHostFunc_ptsz_v10000, cudaLaunchHostFunc(stream, fn, userData));
}
cudaError_t CUDARTAPI cudaLaunchKernel_ptsz(const void* func, dim3 gridDim, dim3 blockDim,
                                            void** args, size_t sharedMem, cudaStream_t stream) {
  PER_THREAD(cudaLaunchKernel_ptsz_v7000, cudaLaunchKernel(func, gridDim, blockDim, args, sharedMem, stream));
}
cudaError_t CUDARTAPI __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                              void** args, size_t sharedMem,
                                              cudaStream_t stream) {
  return cudaLaunchKernel_ptsz(reinterpret_cast<const void*>(kernel), gridDim, blockDim, args,
                               sharedMem, stream);
}
cudaError_t CUDARTAPI cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t* config, const void* func,
                                               void** args) {
  PER_THREAD(cudaLaunchKernelExC_ptsz_v11060, cudaLaunchKernelExC(config, func, args));
}

}  // extern "C"
