// cuGetProcAddress: how the runtime and libraries (cuBLAS, cuDNN, PyTorch) reach nearly
// every driver function. It answers for every function this driver implements, by base
// name ("cuMemAlloc", not "cuMemAlloc_v2"), and hands out the per-thread-default-stream
// variant when asked for it.
//
// Versions: cudasim implements one version of each function (the newest, whose signature
// every requested version since the function's introduction shares for the calls here),
// so any cudaVersion gets it.
#include <cstring>
#include <string_view>

#include "driver.h"
#include "per_thread_entries.h"

namespace cudasim {
namespace {

struct Entry {
  std::string_view name;
  void* function;
  void* perThread;  // the _ptds/_ptsz variant, if the function has one
};

#define ENTRY(base, function) {#base, reinterpret_cast<void*>(&function), nullptr}
#define ENTRY_PT(base, function, perThread) \
  {#base, reinterpret_cast<void*>(&function), reinterpret_cast<void*>(&perThread)}

const Entry kEntries[] = {
    ENTRY(cuInit, cuInit),
    ENTRY(cuDriverGetVersion, cuDriverGetVersion),
    ENTRY(cuGetProcAddress, cuGetProcAddress_v2),
    ENTRY(cuGetExportTable, cuGetExportTable),
    ENTRY(cuGetErrorString, cuGetErrorString),
    ENTRY(cuGetErrorName, cuGetErrorName),
    ENTRY(cuDeviceGet, cuDeviceGet),
    ENTRY(cuDeviceGetCount, cuDeviceGetCount),
    ENTRY(cuDeviceGetName, cuDeviceGetName),
    ENTRY(cuDeviceGetUuid, cuDeviceGetUuid_v2),
    ENTRY(cuDeviceTotalMem, cuDeviceTotalMem_v2),
    ENTRY(cuDeviceGetAttribute, cuDeviceGetAttribute),
    ENTRY(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain),
    ENTRY(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2),
    ENTRY(cuDevicePrimaryCtxGetState, cuDevicePrimaryCtxGetState),
    ENTRY(cuCtxGetCurrent, cuCtxGetCurrent),
    ENTRY(cuCtxSetCurrent, cuCtxSetCurrent),
    ENTRY(cuCtxPushCurrent, cuCtxPushCurrent_v2),
    ENTRY(cuCtxPopCurrent, cuCtxPopCurrent_v2),
    ENTRY(cuCtxGetDevice, cuCtxGetDevice),
    ENTRY(cuCtxSynchronize, cuCtxSynchronize),
    ENTRY(cuMemGetInfo, cuMemGetInfo_v2),
    ENTRY(cuMemAlloc, cuMemAlloc_v2),
    ENTRY(cuMemFree, cuMemFree_v2),
    ENTRY(cuMemGetAddressRange, cuMemGetAddressRange_v2),
    ENTRY(cuPointerGetAttribute, cuPointerGetAttribute),
    ENTRY(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity),
    ENTRY(cuMemAddressReserve, cuMemAddressReserve),
    ENTRY(cuMemAddressFree, cuMemAddressFree),
    ENTRY(cuMemCreate, cuMemCreate),
    ENTRY(cuMemRelease, cuMemRelease),
    ENTRY(cuMemMap, cuMemMap),
    ENTRY(cuMemUnmap, cuMemUnmap),
    ENTRY(cuMemSetAccess, cuMemSetAccess),
    ENTRY(cuMemExportToShareableHandle, cuMemExportToShareableHandle),
    ENTRY(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle),
    ENTRY(cuMemGetAllocationPropertiesFromHandle, cuMemGetAllocationPropertiesFromHandle),
    ENTRY(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle),
    ENTRY(cuMemHostAlloc, cuMemHostAlloc),
    ENTRY(cuMemAllocHost, cuMemAllocHost_v2),
    ENTRY(cuMemFreeHost, cuMemFreeHost),
    ENTRY(cuMemHostRegister, cuMemHostRegister_v2),
    ENTRY(cuMemHostUnregister, cuMemHostUnregister),
    ENTRY(cuMemHostGetDevicePointer, cuMemHostGetDevicePointer_v2),
    ENTRY_PT(cuMemcpy, cuMemcpy, cuMemcpy_ptds),
    ENTRY_PT(cuMemcpyAsync, cuMemcpyAsync, cuMemcpyAsync_ptsz),
    ENTRY_PT(cuMemcpyHtoD, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds),
    ENTRY_PT(cuMemcpyDtoH, cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds),
    ENTRY_PT(cuMemcpyDtoD, cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds),
    ENTRY_PT(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz),
    ENTRY_PT(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz),
    ENTRY_PT(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz),
    ENTRY_PT(cuMemsetD8, cuMemsetD8_v2, cuMemsetD8_v2_ptds),
    ENTRY_PT(cuMemsetD16, cuMemsetD16_v2, cuMemsetD16_v2_ptds),
    ENTRY_PT(cuMemsetD32, cuMemsetD32_v2, cuMemsetD32_v2_ptds),
    ENTRY_PT(cuMemsetD8Async, cuMemsetD8Async, cuMemsetD8Async_ptsz),
    ENTRY_PT(cuMemsetD16Async, cuMemsetD16Async, cuMemsetD16Async_ptsz),
    ENTRY_PT(cuMemsetD32Async, cuMemsetD32Async, cuMemsetD32Async_ptsz),
    ENTRY(cuStreamCreate, cuStreamCreate),
    ENTRY(cuStreamCreateWithPriority, cuStreamCreateWithPriority),
    ENTRY(cuStreamDestroy, cuStreamDestroy_v2),
    ENTRY_PT(cuStreamSynchronize, cuStreamSynchronize, cuStreamSynchronize_ptsz),
    ENTRY_PT(cuStreamQuery, cuStreamQuery, cuStreamQuery_ptsz),
    ENTRY_PT(cuStreamWaitEvent, cuStreamWaitEvent, cuStreamWaitEvent_ptsz),
    ENTRY_PT(cuStreamGetFlags, cuStreamGetFlags, cuStreamGetFlags_ptsz),
    ENTRY(cuEventCreate, cuEventCreate),
    ENTRY(cuEventDestroy, cuEventDestroy_v2),
    ENTRY_PT(cuEventRecord, cuEventRecord, cuEventRecord_ptsz),
    ENTRY_PT(cuEventRecordWithFlags, cuEventRecordWithFlags, cuEventRecordWithFlags_ptsz),
    ENTRY(cuEventQuery, cuEventQuery),
    ENTRY(cuEventSynchronize, cuEventSynchronize),
    ENTRY(cuEventElapsedTime, cuEventElapsedTime_v2),
    ENTRY_PT(cuLaunchKernel, cuLaunchKernel, cuLaunchKernel_ptsz),
    ENTRY_PT(cuLaunchKernelEx, cuLaunchKernelEx, cuLaunchKernelEx_ptsz),
    ENTRY_PT(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz),
    ENTRY_PT(cuLaunchHostFunc, cuLaunchHostFunc, cuLaunchHostFunc_ptsz),
    ENTRY(cuFuncGetParamInfo, cuFuncGetParamInfo),
    ENTRY(cuFuncGetName, cuFuncGetName),
    ENTRY(cuIpcGetMemHandle, cuIpcGetMemHandle),
    ENTRY(cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2),
    ENTRY(cuIpcCloseMemHandle, cuIpcCloseMemHandle),
};

CUresult lookup(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status) {
  auto answer = [status](CUdriverProcAddressQueryResult value, CUresult result) {
    if (status) *status = value;
    return result;
  };
  if (symbol == nullptr || pfn == nullptr || cudaVersion <= 0 ||
      (flags & ~cuuint64_t(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                           CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)))
    return answer(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, CUDA_ERROR_INVALID_VALUE);
  for (const Entry& entry : kEntries) {
    if (entry.name != symbol) continue;
    const bool perThread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    *pfn = perThread && entry.perThread ? entry.perThread : entry.function;
    return answer(CU_GET_PROC_ADDRESS_SUCCESS, CUDA_SUCCESS);
  }
  *pfn = nullptr;
  return answer(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, CUDA_ERROR_NOT_FOUND);
}

}  // namespace

CUresult lookupProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                           CUdriverProcAddressQueryResult* status) {
  return lookup(symbol, pfn, cudaVersion, flags, status);
}

}  // namespace cudasim
