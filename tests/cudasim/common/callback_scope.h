// Raises the CUPTI API_ENTER / API_EXIT callbacks around one API call.
// Shared by the driver and the runtime so both fill CUpti_CallbackData the same way.
#pragma once

#include "export_table.h"

namespace cudasim {

struct CallSite {
  CUpti_CallbackDomain domain;
  CUpti_CallbackId cbid;
  const char* name;
};

// Calls `body` (returning CUresult or cudaError_t) between the two callbacks. The callback
// runs on the calling thread, may itself call the API (and get callbacks for those calls).
// `correlationId` 0 means: the id of the call this thread is inside, else a new one. While the
// callbacks and the body run, calls made on this thread take this call's id.
template <class Result, class Body>
Result invokeWithCallbacks(CallbackState& state, const CallSite& site, const void* params,
                           const char* symbolName, CUcontext context, uint32_t correlationId,
                           Body&& body) {
  CUpti_CallbackFunc subscriber = state.subscriber.load(std::memory_order_acquire);
  if (subscriber == nullptr || !state.enabled(site.domain, site.cbid)) return body();
  void* userdata = state.userdata.load(std::memory_order_relaxed);
  uint64_t correlationData = 0;
  CUpti_CallbackData data{};
  data.callbackSite = CUPTI_API_ENTER;
  data.functionName = site.name;
  data.functionParams = params;
  data.symbolName = symbolName;
  data.context = context;
  data.contextUid = context != nullptr ? 1 : 0;
  data.correlationData = &correlationData;
  uint32_t* active = state.threadCorrelation ? state.threadCorrelation() : nullptr;
  const uint32_t outer = active != nullptr ? *active : 0;
  data.correlationId =
      correlationId != 0 ? correlationId
      : outer != 0       ? outer
                         : state.nextCorrelationId.fetch_add(1, std::memory_order_relaxed);
  if (active != nullptr) *active = data.correlationId;
  subscriber(userdata, site.domain, site.cbid, &data);
  Result result = body();
  data.callbackSite = CUPTI_API_EXIT;
  data.functionReturnValue = &result;
  subscriber(userdata, site.domain, site.cbid, &data);
  if (active != nullptr) *active = outer;
  return result;
}

}  // namespace cudasim
