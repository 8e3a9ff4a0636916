// cudasim's libcupti.so.13: the callback API subset. The subscriber slot lives in the
// driver (CUPTI is only a door to it), reached through cuGetExportTable like the real
// CUPTI reaches its driver; the driver and the runtime raise the callbacks themselves.
//
// CUDASIM_CUPTI_HELD_BY="<tool>" makes the slot look taken by another tool (Nsight Systems,
// compute-sanitizer, ...), so that tests can see what a tool does when it cannot subscribe.
// The faults cupti-subscribe-fail and cupti-enable-fail (CUDASIM_FAULTS, driver/faults.h)
// make subscribing, or enabling callbacks, fail with CUPTI_ERROR_NOT_INITIALIZED, as CUPTI
// does when it cannot attach to the driver.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <cupti.h>

#include "../common/export_table.h"

namespace cudasim {
namespace {

struct Subscriber {};  // the handle's identity is all that matters: there is one slot
Subscriber gSubscriber;
const ExportTable* gTable = nullptr;

// Finds cudasim's driver, already loaded or not.
const ExportTable* table() {
  static std::once_flag once;
  std::call_once(once, [] {
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) return;
    auto getExportTable =
        reinterpret_cast<decltype(&cuGetExportTable)>(dlsym(handle, "cuGetExportTable"));
    const void* found = nullptr;
    if (getExportTable && getExportTable(&found, &kExportTableId) == CUDA_SUCCESS &&
        static_cast<const ExportTable*>(found)->size == sizeof(ExportTable))
      gTable = static_cast<const ExportTable*>(found);
  });
  return gTable;
}

bool isOurs(CUpti_SubscriberHandle subscriber) {
  return subscriber == reinterpret_cast<CUpti_SubscriberHandle>(&gSubscriber);
}

CUptiResult setCallback(bool enable, CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  if (table()->cuptiEnableFails()) return CUPTI_ERROR_NOT_INITIALIZED;
  CallbackState& state = *table()->callbacks;
  if (domain == CUPTI_CB_DOMAIN_DRIVER_API && cbid < CUPTI_DRIVER_TRACE_CBID_SIZE)
    state.driverEnabled[cbid].store(enable);
  else if (domain == CUPTI_CB_DOMAIN_RUNTIME_API && cbid < CUPTI_RUNTIME_TRACE_CBID_SIZE)
    state.runtimeEnabled[cbid].store(enable);
  else if (domain <= CUPTI_CB_DOMAIN_INVALID || domain >= CUPTI_CB_DOMAIN_SIZE)
    return CUPTI_ERROR_INVALID_PARAMETER;
  // Other domains (resource, synchronize, NVTX, state) are accepted and never raised.
  return CUPTI_SUCCESS;
}

}  // namespace
}  // namespace cudasim

using namespace cudasim;

extern "C" {

CUptiResult CUPTIAPI cuptiSubscribe_v2(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc callback,
                                       void* userdata, CUpti_SubscriberParams* pParams) {
  if (subscriber == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  const char* name = pParams && pParams->structSize >= sizeof(size_t) + sizeof(const char*)
                         ? pParams->subscriberName
                         : nullptr;
  auto reportHolder = [pParams](const char* holder) {
    if (pParams && pParams->oldSubscriberName && pParams->oldSubscriberSize > 0)
      std::snprintf(pParams->oldSubscriberName, pParams->oldSubscriberSize, "%s", holder);
  };
  if (const char* heldBy = std::getenv("CUDASIM_CUPTI_HELD_BY"); heldBy && *heldBy) {
    reportHolder(heldBy);
    return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  }
  // Without a driver the real CUPTI fails with CUPTI_ERROR_UNKNOWN (seen with CUDA 13.0).
  if (table() == nullptr) return CUPTI_ERROR_UNKNOWN;
  if (table()->cuptiSubscribeFails()) return CUPTI_ERROR_NOT_INITIALIZED;
  const char* holder = nullptr;
  if (!table()->subscribe(callback, userdata, name, &holder)) {
    reportHolder(holder);
    return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  }
  *subscriber = reinterpret_cast<CUpti_SubscriberHandle>(&gSubscriber);
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiSubscribe(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc callback,
                                    void* userdata) {
  return cuptiSubscribe_v2(subscriber, callback, userdata, nullptr);
}

CUptiResult CUPTIAPI cuptiUnsubscribe(CUpti_SubscriberHandle subscriber) {
  if (!isOurs(subscriber) || table() == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  table()->unsubscribe();
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle subscriber,
                                         CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  if (!isOurs(subscriber) || table() == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  return setCallback(enable != 0, domain, cbid);
}

CUptiResult CUPTIAPI cuptiEnableDomain(uint32_t enable, CUpti_SubscriberHandle subscriber,
                                       CUpti_CallbackDomain domain) {
  if (!isOurs(subscriber) || table() == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  CUpti_CallbackId size = domain == CUPTI_CB_DOMAIN_DRIVER_API    ? CUPTI_DRIVER_TRACE_CBID_SIZE
                          : domain == CUPTI_CB_DOMAIN_RUNTIME_API ? CUPTI_RUNTIME_TRACE_CBID_SIZE
                                                                  : 0;
  if (size == 0) return setCallback(enable != 0, domain, 0);
  for (CUpti_CallbackId cbid = 1; cbid < size; ++cbid)
    if (CUptiResult r = setCallback(enable != 0, domain, cbid)) return r;
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiEnableAllDomains(uint32_t enable, CUpti_SubscriberHandle subscriber) {
  for (int domain = CUPTI_CB_DOMAIN_DRIVER_API; domain < CUPTI_CB_DOMAIN_SIZE; ++domain)
    if (CUptiResult r = cuptiEnableDomain(enable, subscriber, static_cast<CUpti_CallbackDomain>(domain)))
      return r;
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetCallbackState(uint32_t* enable, CUpti_SubscriberHandle subscriber,
                                           CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  if (enable == nullptr || !isOurs(subscriber) || table() == nullptr)
    return CUPTI_ERROR_INVALID_PARAMETER;
  *enable = table()->callbacks->enabled(domain, cbid);
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetResultString(CUptiResult result, const char** str) {
  if (str == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  switch (result) {
    case CUPTI_SUCCESS: *str = "CUPTI_SUCCESS"; break;
    case CUPTI_ERROR_INVALID_PARAMETER: *str = "CUPTI_ERROR_INVALID_PARAMETER"; break;
    case CUPTI_ERROR_NOT_INITIALIZED: *str = "CUPTI_ERROR_NOT_INITIALIZED"; break;
    case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
      *str = "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED";
      break;
    case CUPTI_ERROR_NOT_SUPPORTED: *str = "CUPTI_ERROR_NOT_SUPPORTED"; break;
    case CUPTI_ERROR_UNKNOWN: *str = "CUPTI_ERROR_UNKNOWN"; break;
    default: *str = "CUPTI_ERROR_UNKNOWN"; return CUPTI_ERROR_INVALID_PARAMETER;
  }
  return CUPTI_SUCCESS;
}

}  // extern "C"
