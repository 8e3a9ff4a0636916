// The public C API of include/delta/delta.h. Nothing here throws or blocks for long.
#include "delta/delta.h"

#include "shim/shim.h"

#define DELTA_EXPORT extern "C" __attribute__((visibility("default")))

using delta::shim::Residency;
using delta::shim::Shim;

namespace {

// The residency manager, without activating the shim for a mere question.
Residency* current() { return Shim::instance().disabled() ? nullptr : Shim::instance().activeIfStarted(); }

}  // namespace

DELTA_EXPORT int delta_api_version(void) { return DELTA_API_VERSION; }

DELTA_EXPORT const char* delta_version(void) { return DELTA_VERSION_STRING; }

DELTA_EXPORT int delta_is_active(void) { return current() != nullptr; }

DELTA_EXPORT int delta_get_stats(struct delta_stats* stats, size_t size) {
  Residency* residency = current();
  if (residency == nullptr || stats == nullptr) return -1;
  delta::shim::Stats s = residency->stats();
  delta_stats full{};
  full.budget_bytes = residency->budget();
  full.resident_bytes = s.residentBytes;
  full.peak_resident_bytes = s.peakResidentBytes;
  full.live_buffers = s.liveBuffers;
  full.evictions = s.evictions;
  full.restores = s.restores;
  full.bytes_to_host = s.bytesToHost;
  full.bytes_to_device = s.bytesToDevice;
  full.stall_ns = s.stallNs;
  full.over_budget_launches = s.overBudgetLaunches;
  full.unanalysed_launches = s.unanalysedLaunches;
  __builtin_memcpy(stats, &full, size < sizeof full ? size : sizeof full);
  return 0;
}

DELTA_EXPORT int delta_pin(const void* ptr) {
  Residency* residency = current();
  return residency && residency->pin(reinterpret_cast<CUdeviceptr>(ptr), true) ? 0 : -1;
}

DELTA_EXPORT int delta_unpin(const void* ptr) {
  Residency* residency = current();
  return residency && residency->pin(reinterpret_cast<CUdeviceptr>(ptr), false) ? 0 : -1;
}
