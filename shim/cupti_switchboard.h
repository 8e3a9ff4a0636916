// The one CUPTI subscription of the shim, and the switchboard that turns callback ids of
// both domains into a few kinds of work (kernel launch, copy, memset, graph launch), each
// handed to the residency manager before the work is enqueued (at API_ENTER).
//
// A runtime call raises its runtime-domain callback and, on some drivers, the driver-domain
// callbacks of the driver calls it makes, with the same correlation id. The first one seen
// is handled; the others are recognised by that id and skipped. Either domain alone is
// enough, so the shim is right whichever of them a driver raises.
//
// Hot path rules (the callback runs inside every CUDA call): no allocation once scratch has
// grown, no logging, no lock but the residency lock and the kernel-layout cache's.
#pragma once

#include <string>

#include "shim/param_scanner.h"
#include "shim/real_api.h"
#include "shim/residency.h"

namespace delta::shim {

struct CuptiStatus {
  bool subscribed = false;
  std::string message;  // why not, for the one line the user sees
};

// Loads libcupti (DELTA_CUPTI_PATH, else beside the CUDA runtime the program loaded, else
// the toolkit, else the pip nvidia-cuda-cupti layout), subscribes and enables the callbacks.
CuptiStatus subscribeCupti(const std::string& cuptiPath, const DriverApi& api,
                           Residency& residency);

// The launch interposers (cudaLaunchKernel, cuLaunchKernel) prepare a launch before calling
// the real function, so that a launch the budget cannot hold under DELTA_STRICT=1 fails
// instead of running; the CUPTI callbacks of that call then have nothing left to do.
CUresult prepareKernelLaunch(CUfunction function, CUstream stream, bool perThread,
                             void** params, void** extra);
CUresult prepareRuntimeLaunch(const void* symbol, CUstream stream, bool perThread, void** args);

// After fork, in the child: callbacks do nothing (the parent's state is not the child's).
void detachCupti();

// True inside a PreparedLaunchScope: the launch is already prepared.
bool launchAlreadyPrepared();

// While alive, the CUPTI callbacks of this thread's calls do nothing: the interposer did it.
// Create it right after a successful prepare...(): its end releases the launch's buffers.
class PreparedLaunchScope {
 public:
  PreparedLaunchScope();
  ~PreparedLaunchScope();
  PreparedLaunchScope(const PreparedLaunchScope&) = delete;
  PreparedLaunchScope& operator=(const PreparedLaunchScope&) = delete;

 private:
  bool outer_;
};

}  // namespace delta::shim
