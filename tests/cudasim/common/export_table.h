// The private interface between cudasim's driver, runtime and CUPTI.
//
// The real runtime and CUPTI reach private driver services through cuGetExportTable with
// undocumented UUIDs; cudasim does the same with its own UUID, so nothing here is visible
// to an interposer that (rightly) never wraps cuGetExportTable, and the public symbol
// tables of the three libraries hold only the real API.
#pragma once

#include <cuda.h>
#include <cupti_callbacks.h>
#include <cupti_driver_cbid.h>
#include <cupti_runtime_cbid.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "cudasim/cudasim.h"

namespace cudasim {

inline constexpr CUuuid kExportTableId = {
    {'c', 'u', 'd', 'a', 's', 'i', 'm', ':', 'p', 'r', 'i', 'v', 'a', 't', 'e', '1'}};

// The one CUPTI subscriber slot and its enabled callbacks. Read on every API call, so the
// check is two relaxed loads when nobody is subscribed.
struct CallbackState {
  std::atomic<CUpti_CallbackFunc> subscriber{nullptr};
  std::atomic<void*> userdata{nullptr};
  std::atomic<uint8_t> driverEnabled[CUPTI_DRIVER_TRACE_CBID_SIZE]{};
  std::atomic<uint8_t> runtimeEnabled[CUPTI_RUNTIME_TRACE_CBID_SIZE]{};
  std::atomic<uint32_t> nextCorrelationId{1};
  // The correlation id of the call whose callbacks or body this thread is inside (0: none),
  // the driver's thread-local: a call made from there, from a callback too, takes that id, as
  // under real CUPTI (seen on an H200: a cuCtxGetCurrent made inside cuMemAlloc's API_ENTER
  // callback carried cuMemAlloc's id).
  uint32_t* (*threadCorrelation)() = nullptr;

  bool enabled(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) const {
    if (domain == CUPTI_CB_DOMAIN_DRIVER_API)
      return cbid < CUPTI_DRIVER_TRACE_CBID_SIZE &&
             driverEnabled[cbid].load(std::memory_order_relaxed);
    if (domain == CUPTI_CB_DOMAIN_RUNTIME_API)
      return cbid < CUPTI_RUNTIME_TRACE_CBID_SIZE &&
             runtimeEnabled[cbid].load(std::memory_order_relaxed);
    return false;
  }
};

// What the runtime tells the driver about the driver call it is about to make, so that the
// driver can give that call the runtime call's correlation id (as CUPTI documents) and, when
// CUDASIM_CUPTI_DRIVER_CALLBACKS=0, raise no driver-domain callback for it.
struct RuntimeOrigin {
  CUpti_CallbackId driverCbid = 0;  // 0: no runtime call in progress
  uint32_t correlationId = 0;
};

struct ExportTable {
  size_t size;  // sizeof(ExportTable): checked by the users
  void (*registerKernel)(const void* symbol, const char* name, cudasimKernelBody body,
                         int paramCount, const size_t* paramSizes);
  // CUDA_ERROR_INVALID_HANDLE for a symbol that was never registered.
  CUresult (*functionForSymbol)(const void* symbol, CUfunction* function);
  CallbackState* callbacks;
  // Takes the subscriber slot. Fails (false) when it is held, and then names the holder.
  bool (*subscribe)(CUpti_CallbackFunc callback, void* userdata, const char* name,
                    const char** holder);
  void (*unsubscribe)();
  void (*setRuntimeOrigin)(RuntimeOrigin origin);
  // Injected faults (driver/faults.h): the runtime's cudasimSetFaults, and whether CUPTI must
  // refuse a subscription or the enabling of callbacks.
  const char* (*setFaults)(const char* spec);
  bool (*cuptiSubscribeFails)();
  bool (*cuptiEnableFails)();
  // cudasimKernelTime: the running kernel body's device time (driver/timing.h).
  void (*kernelTime)(int64_t nanoseconds);
  // cudasimTimingOverruns: timed items whose host work outlasted their modeled time so far.
  uint64_t (*timingOverruns)();
  // cudaGetKernel: the kernel handle of a registered symbol (CUDA_ERROR_INVALID_HANDLE if none).
  CUresult (*kernelForSymbol)(const void* symbol, CUkernel* kernel);
  // A kernel handle's function (CUDA_ERROR_INVALID_HANDLE: no such kernel); `load`: loaded
  // into the context, as a launch through the handle does (a name asked for does not).
  CUresult (*functionForKernel)(CUkernel kernel, CUfunction* function, bool load);
  // CUDASIM_FAULTS=foreign-stubs: cudaGetFuncBySymbol knows no symbol.
  bool (*foreignStubs)();
  // cudasimTimingOverrunNs: by how much, in all, those items outlasted their modeled time.
  int64_t (*timingOverrunNs)();
};

}  // namespace cudasim
