// cuGetProcAddress: how the runtime and libraries (cuBLAS, cuDNN, PyTorch) reach nearly
// every driver function. It answers for every function this driver implements, by base
// name ("cuMemAlloc", not "cuMemAlloc_v2"), and hands out the per-thread-default-stream
// variant when asked for it.
//
// Versions: an entry serves every cudaVersion from the one it names up to the driver's own;
// where a function's signature changed (cuGetProcAddress), two entries of the same name
// hand out the version that matches. Otherwise cudasim implements the newest version of each
// function, whose signature the older versions it stands in for share.
#include <cstring>
#include <string_view>

#include "driver.h"
#include "per_thread_entries.h"

// cuda.h maps cuGetProcAddress to its _v2; the table lists the first version as well.
#undef cuGetProcAddress
extern "C" CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                             cuuint64_t flags);
// Likewise cuMemAdvise and cuMemPrefetchAsync, whose first versions took a device (before 12.2).
#undef cuMemAdvise
#undef cuMemPrefetchAsync
extern "C" CUresult CUDAAPI cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                                        CUdevice device);
extern "C" CUresult CUDAAPI cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count,
                                               CUdevice dstDevice, CUstream stream);

namespace cudasim {
namespace {

constexpr int kDriverVersion = 13000;

struct Entry {
  std::string_view name;
  int since;        // the first cudaVersion that has it (this signature)
  void* function;
  void* perThread;  // the _ptds/_ptsz variant, if the function has one
};

#define ENTRY_SINCE(base, since, function) {#base, since, reinterpret_cast<void*>(&function), nullptr}
// (Stringified here, not passed on: cuda.h maps some base names to _v2 macros.)
#define ENTRY(base, function) {#base, 2000, reinterpret_cast<void*>(&function), nullptr}
#define ENTRY_PT(base, function, perThread) \
  {#base, 2000, reinterpret_cast<void*>(&function), reinterpret_cast<void*>(&perThread)}

const Entry kEntries[] = {
    ENTRY(cuInit, cuInit),
    ENTRY(cuDriverGetVersion, cuDriverGetVersion),
    ENTRY_SINCE(cuGetProcAddress, 12000, cuGetProcAddress_v2),
    ENTRY_SINCE(cuGetProcAddress, 11030, cuGetProcAddress),
    ENTRY(cuGetExportTable, cuGetExportTable),
    ENTRY(cuGetErrorString, cuGetErrorString),
    ENTRY(cuGetErrorName, cuGetErrorName),
    ENTRY(cuDeviceGet, cuDeviceGet),
    ENTRY(cuDeviceGetCount, cuDeviceGetCount),
    ENTRY(cuDeviceGetName, cuDeviceGetName),
    ENTRY_SINCE(cuDeviceGetUuid, 9020, cuDeviceGetUuid_v2),
    ENTRY(cuDeviceTotalMem, cuDeviceTotalMem_v2),
    ENTRY(cuDeviceGetAttribute, cuDeviceGetAttribute),
    ENTRY_SINCE(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain),
    ENTRY_SINCE(cuDevicePrimaryCtxRelease, 7000, cuDevicePrimaryCtxRelease_v2),
    ENTRY_SINCE(cuDevicePrimaryCtxGetState, 7000, cuDevicePrimaryCtxGetState),
    ENTRY_SINCE(cuCtxGetCurrent, 4000, cuCtxGetCurrent),
    ENTRY_SINCE(cuCtxSetCurrent, 4000, cuCtxSetCurrent),
    ENTRY(cuCtxPushCurrent, cuCtxPushCurrent_v2),
    ENTRY(cuCtxPopCurrent, cuCtxPopCurrent_v2),
    ENTRY(cuCtxGetDevice, cuCtxGetDevice),
    ENTRY(cuCtxSynchronize, cuCtxSynchronize),
    ENTRY(cuMemGetInfo, cuMemGetInfo_v2),
    ENTRY(cuMemAlloc, cuMemAlloc_v2),
    ENTRY(cuMemFree, cuMemFree_v2),
    ENTRY(cuMemGetAddressRange, cuMemGetAddressRange_v2),
    ENTRY_SINCE(cuPointerGetAttribute, 4000, cuPointerGetAttribute),
    ENTRY_SINCE(cuMemGetAllocationGranularity, 10020, cuMemGetAllocationGranularity),
    ENTRY_SINCE(cuMemAddressReserve, 10020, cuMemAddressReserve),
    ENTRY_SINCE(cuMemAddressFree, 10020, cuMemAddressFree),
    ENTRY_SINCE(cuMemCreate, 10020, cuMemCreate),
    ENTRY_SINCE(cuMemRelease, 10020, cuMemRelease),
    ENTRY_SINCE(cuMemMap, 10020, cuMemMap),
    ENTRY_SINCE(cuMemUnmap, 10020, cuMemUnmap),
    ENTRY_SINCE(cuMemSetAccess, 10020, cuMemSetAccess),
    ENTRY_SINCE(cuMemExportToShareableHandle, 10020, cuMemExportToShareableHandle),
    ENTRY_SINCE(cuMemImportFromShareableHandle, 10020, cuMemImportFromShareableHandle),
    ENTRY_SINCE(cuMemGetAllocationPropertiesFromHandle, 10020, cuMemGetAllocationPropertiesFromHandle),
    ENTRY_SINCE(cuMemRetainAllocationHandle, 11000, cuMemRetainAllocationHandle),
    ENTRY(cuMemAllocPitch, cuMemAllocPitch_v2),
    {"cuMemAllocAsync", 11020, reinterpret_cast<void*>(&cuMemAllocAsync), reinterpret_cast<void*>(&cuMemAllocAsync_ptsz)},
    {"cuMemAllocFromPoolAsync", 11020, reinterpret_cast<void*>(&cuMemAllocFromPoolAsync), reinterpret_cast<void*>(&cuMemAllocFromPoolAsync_ptsz)},
    {"cuMemFreeAsync", 11020, reinterpret_cast<void*>(&cuMemFreeAsync), reinterpret_cast<void*>(&cuMemFreeAsync_ptsz)},
    ENTRY_SINCE(cuMemPoolCreate, 11020, cuMemPoolCreate),
    ENTRY_SINCE(cuMemPoolDestroy, 11020, cuMemPoolDestroy),
    ENTRY_SINCE(cuMemPoolSetAttribute, 11020, cuMemPoolSetAttribute),
    ENTRY_SINCE(cuMemPoolGetAttribute, 11020, cuMemPoolGetAttribute),
    ENTRY_SINCE(cuMemPoolTrimTo, 11020, cuMemPoolTrimTo),
    ENTRY_SINCE(cuMemPoolSetAccess, 11020, cuMemPoolSetAccess),
    ENTRY_SINCE(cuMemPoolGetAccess, 11020, cuMemPoolGetAccess),
    ENTRY_SINCE(cuMemPoolExportToShareableHandle, 11020, cuMemPoolExportToShareableHandle),
    ENTRY_SINCE(cuMemPoolImportFromShareableHandle, 11020, cuMemPoolImportFromShareableHandle),
    ENTRY_SINCE(cuMemPoolExportPointer, 11020, cuMemPoolExportPointer),
    ENTRY_SINCE(cuMemPoolImportPointer, 11020, cuMemPoolImportPointer),
    ENTRY_SINCE(cuDeviceGetDefaultMemPool, 11020, cuDeviceGetDefaultMemPool),
    ENTRY_SINCE(cuDeviceGetMemPool, 11020, cuDeviceGetMemPool),
    ENTRY_SINCE(cuDeviceSetMemPool, 11020, cuDeviceSetMemPool),
    ENTRY_SINCE(cuMemAllocManaged, 6000, cuMemAllocManaged),
    // The signatures changed in 12.2 (a CUmemLocation instead of a device).
    ENTRY_SINCE(cuMemAdvise, 8000, cuMemAdvise),
    ENTRY_SINCE(cuMemAdvise, 12020, cuMemAdvise_v2),
    {"cuMemPrefetchAsync", 8000, reinterpret_cast<void*>(&cuMemPrefetchAsync), reinterpret_cast<void*>(&cuMemPrefetchAsync_ptsz)},
    {"cuMemPrefetchAsync", 12020, reinterpret_cast<void*>(&cuMemPrefetchAsync_v2), reinterpret_cast<void*>(&cuMemPrefetchAsync_v2_ptsz)},
    ENTRY_SINCE(cuMemRangeGetAttribute, 8000, cuMemRangeGetAttribute),
    ENTRY(cuMemHostAlloc, cuMemHostAlloc),
    ENTRY(cuMemAllocHost, cuMemAllocHost_v2),
    ENTRY(cuMemFreeHost, cuMemFreeHost),
    ENTRY_SINCE(cuMemHostRegister, 4000, cuMemHostRegister_v2),
    ENTRY_SINCE(cuMemHostUnregister, 4000, cuMemHostUnregister),
    ENTRY(cuMemHostGetDevicePointer, cuMemHostGetDevicePointer_v2),
    ENTRY_PT(cuMemcpy, cuMemcpy, cuMemcpy_ptds),
    ENTRY_PT(cuMemcpyAsync, cuMemcpyAsync, cuMemcpyAsync_ptsz),
    ENTRY_PT(cuMemcpyHtoD, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds),
    ENTRY_PT(cuMemcpyDtoH, cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds),
    ENTRY_PT(cuMemcpyDtoD, cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds),
    ENTRY_PT(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz),
    ENTRY_PT(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz),
    ENTRY_PT(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz),
    ENTRY_PT(cuMemcpy2D, cuMemcpy2D_v2, cuMemcpy2D_v2_ptds),
    ENTRY_PT(cuMemcpy2DUnaligned, cuMemcpy2DUnaligned_v2, cuMemcpy2DUnaligned_v2_ptds),
    ENTRY_PT(cuMemcpy2DAsync, cuMemcpy2DAsync_v2, cuMemcpy2DAsync_v2_ptsz),
    ENTRY_PT(cuMemsetD8, cuMemsetD8_v2, cuMemsetD8_v2_ptds),
    ENTRY_PT(cuMemsetD16, cuMemsetD16_v2, cuMemsetD16_v2_ptds),
    ENTRY_PT(cuMemsetD32, cuMemsetD32_v2, cuMemsetD32_v2_ptds),
    ENTRY_PT(cuMemsetD8Async, cuMemsetD8Async, cuMemsetD8Async_ptsz),
    ENTRY_PT(cuMemsetD16Async, cuMemsetD16Async, cuMemsetD16Async_ptsz),
    ENTRY_PT(cuMemsetD32Async, cuMemsetD32Async, cuMemsetD32Async_ptsz),
    ENTRY(cuStreamCreate, cuStreamCreate),
    ENTRY_SINCE(cuStreamCreateWithPriority, 5050, cuStreamCreateWithPriority),
    ENTRY(cuStreamDestroy, cuStreamDestroy_v2),
    ENTRY_PT(cuStreamSynchronize, cuStreamSynchronize, cuStreamSynchronize_ptsz),
    ENTRY_PT(cuStreamQuery, cuStreamQuery, cuStreamQuery_ptsz),
    ENTRY_PT(cuStreamWaitEvent, cuStreamWaitEvent, cuStreamWaitEvent_ptsz),
    {"cuStreamGetFlags", 5050, reinterpret_cast<void*>(&cuStreamGetFlags), reinterpret_cast<void*>(&cuStreamGetFlags_ptsz)},
    ENTRY(cuEventCreate, cuEventCreate),
    ENTRY(cuEventDestroy, cuEventDestroy_v2),
    ENTRY_PT(cuEventRecord, cuEventRecord, cuEventRecord_ptsz),
    {"cuEventRecordWithFlags", 11010, reinterpret_cast<void*>(&cuEventRecordWithFlags), reinterpret_cast<void*>(&cuEventRecordWithFlags_ptsz)},
    ENTRY(cuEventQuery, cuEventQuery),
    ENTRY(cuEventSynchronize, cuEventSynchronize),
    ENTRY(cuEventElapsedTime, cuEventElapsedTime_v2),
    ENTRY_PT(cuLaunchKernel, cuLaunchKernel, cuLaunchKernel_ptsz),
    {"cuLaunchKernelEx", 11060, reinterpret_cast<void*>(&cuLaunchKernelEx), reinterpret_cast<void*>(&cuLaunchKernelEx_ptsz)},
    {"cuLaunchCooperativeKernel", 9000, reinterpret_cast<void*>(&cuLaunchCooperativeKernel), reinterpret_cast<void*>(&cuLaunchCooperativeKernel_ptsz)},
    {"cuStreamWaitValue32", 12000, reinterpret_cast<void*>(&cuStreamWaitValue32_v2),
     reinterpret_cast<void*>(&cuStreamWaitValue32_v2_ptsz)},
    {"cuLaunchHostFunc", 10000, reinterpret_cast<void*>(&cuLaunchHostFunc), reinterpret_cast<void*>(&cuLaunchHostFunc_ptsz)},
    ENTRY_SINCE(cuFuncGetParamInfo, 12040, cuFuncGetParamInfo),
    ENTRY_SINCE(cuFuncGetName, 12030, cuFuncGetName),
    ENTRY_SINCE(cuKernelGetFunction, 12000, cuKernelGetFunction),
    ENTRY_SINCE(cuKernelGetParamInfo, 12040, cuKernelGetParamInfo),
    ENTRY_SINCE(cuKernelGetName, 12030, cuKernelGetName),
    ENTRY_SINCE(cuIpcGetMemHandle, 4010, cuIpcGetMemHandle),
    ENTRY_SINCE(cuIpcOpenMemHandle, 4010, cuIpcOpenMemHandle_v2),
    ENTRY_SINCE(cuIpcCloseMemHandle, 4010, cuIpcCloseMemHandle),
};

CUresult lookup(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status) {
  auto answer = [status](CUdriverProcAddressQueryResult value, CUresult result) {
    if (status) *status = value;
    return result;
  };
  if (symbol == nullptr || pfn == nullptr || cudaVersion <= 0 || cudaVersion > kDriverVersion ||
      (flags & ~cuuint64_t(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                           CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)))
    return answer(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, CUDA_ERROR_INVALID_VALUE);
  // As documented: a symbol that is unknown, or too new for cudaVersion, is CUDA_SUCCESS
  // with a NULL pointer, and the status says which.
  *pfn = nullptr;
  const Entry* best = nullptr;
  bool known = false;
  for (const Entry& entry : kEntries) {
    if (entry.name != symbol) continue;
    known = true;
    if (entry.since <= cudaVersion && (best == nullptr || entry.since > best->since)) best = &entry;
  }
  if (best == nullptr)
    return answer(known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                        : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
                  CUDA_SUCCESS);
  const bool perThread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  *pfn = perThread && best->perThread ? best->perThread : best->function;
  return answer(CU_GET_PROC_ADDRESS_SUCCESS, CUDA_SUCCESS);
}

}  // namespace

CUresult lookupProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                           CUdriverProcAddressQueryResult* status) {
  return lookup(symbol, pfn, cudaVersion, flags, status);
}

}  // namespace cudasim
