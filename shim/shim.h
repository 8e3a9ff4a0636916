// The shim's state: options (read once, in the library's constructor), the driver it talks
// to, and, once active, the residency manager. Activation is lazy, at the first interposed
// call that needs it, because the program's CUDA runtime may not have loaded the driver
// before then. Any failure on the way (no driver, no device, CUPTI unavailable) leaves the
// shim in pass-through mode: every call goes to the real function untouched.
#pragma once

#include <atomic>
#include <memory>

#include "shim/options.h"
#include "shim/real_api.h"
#include "shim/residency.h"
#include "trace/trace_writer.h"

namespace delta::shim {

class Shim {
 public:
  static Shim& instance();

  // Parses DELTA_*; on a bad value prints one line and ends the process (exit status 1).
  void configure();
  const Options& options() const { return options_; }

  // The residency manager, activating the shim on first use; nullptr in pass-through mode.
  Residency* active() {
    Residency* residency = residency_.load(std::memory_order_acquire);
    if (residency != nullptr || passThrough_.load(std::memory_order_relaxed)) return residency;
    return activate();
  }
  // The residency manager if the shim is already active; never activates.
  Residency* activeIfStarted() const { return residency_.load(std::memory_order_acquire); }
  bool disabled() const { return options_.disabled; }
  const DriverApi& driver() const { return driver_; }
  // The driver's entry points once activation has fetched them (nullptr before): another thread
  // may be filling them in meanwhile, so interposers look through this, not driver().
  const DriverApi* loadedDriver() const {
    return driverLoaded_.load(std::memory_order_acquire) ? &driver_ : nullptr;
  }
  uint64_t minManagedBytes() const { return options_.minBytes; }

  // At exit: the summary (DELTA_VERBOSE) and the trace's closing record.
  void finish();
  void printSummary();

 private:
  Residency* activate();
  void openTrace(Residency& residency, const char* deviceName, uint64_t deviceBytes,
                 uint64_t budget);
  static void afterForkInChild();

  Options options_;
  DriverApi driver_;
  std::atomic<Residency*> residency_{nullptr};
  std::atomic<bool> passThrough_{false};
  std::atomic<bool> driverLoaded_{false};
  trace::TraceWriter trace_;
};

}  // namespace delta::shim
