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
  full.drops = s.drops;
  full.recomputes = s.recomputes;
  full.recompute_failures = s.recomputeFailures;
  full.recompute_ns = s.recomputeNs;
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

DELTA_EXPORT int delta_declare_extent(const void* ptr, size_t bytes) {
  Residency* residency = current();
  return residency ? residency->declareExtent(reinterpret_cast<CUdeviceptr>(ptr), bytes) : -1;
}

// ---- recompute ---------------------------------------------------------------------------

namespace {

CUdeviceptr address(const void* ptr) { return reinterpret_cast<CUdeviceptr>(ptr); }

// Registrations come from a framework that may not have allocated through the shim yet when it
// asks; they apply only to managed buffers, so an inactive shim answers -1.
int registerHook(const void* ptr, uint64_t cost_ns, delta::shim::RecomputeHook::Kind kind,
                 delta_recompute_fn fn, void* ctx) {
  Residency* residency = current();
  if (residency == nullptr || ptr == nullptr) return -1;
  delta::shim::RecomputeHook hook;
  hook.kind = kind;
  hook.callback = fn;
  hook.context = ctx;
  hook.estimateNs = static_cast<int64_t>(cost_ns > INT64_MAX ? INT64_MAX : cost_ns);
  return residency->setRecompute(address(ptr), hook);
}

}  // namespace

DELTA_EXPORT int delta_register_recompute(const void* ptr, uint64_t cost_ns, delta_recompute_fn fn,
                                          void* ctx) {
  if (fn == nullptr) return -1;
  return registerHook(ptr, cost_ns, delta::shim::RecomputeHook::Kind::kCallback, fn, ctx);
}

DELTA_EXPORT int delta_register_framework_managed(const void* ptr, uint64_t cost_ns) {
  return registerHook(ptr, cost_ns, delta::shim::RecomputeHook::Kind::kFramework, nullptr, nullptr);
}

DELTA_EXPORT int delta_unregister(const void* ptr) {
  Residency* residency = current();
  return residency ? residency->clearRecompute(address(ptr)) : -1;
}

DELTA_EXPORT int delta_is_dropped(const void* ptr) {
  Residency* residency = current();
  return residency ? residency->isDropped(address(ptr)) : -1;
}

DELTA_EXPORT int delta_begin_recompute(const void* ptr) {
  Residency* residency = current();
  return residency ? residency->beginRecompute(address(ptr)) : -1;
}

DELTA_EXPORT int delta_recomputed(const void* ptr) {
  Residency* residency = current();
  return residency ? residency->endRecompute(address(ptr)) : -1;
}

DELTA_EXPORT int delta_set_drop_notifier(delta_drop_fn fn, void* ctx) {
  // Kept for the process, not the residency manager: a framework sets it at start-up, before
  // its first allocation has activated the shim.
  Residency::setDropNotifier(fn, ctx);
  return 0;
}

DELTA_EXPORT int delta_mark_iteration(void) {
  if (Residency* residency = current()) residency->markIteration();
  return 0;
}

// ---- PyTorch's CUDAPluggableAllocator ---------------------------------------------------

// With libdelta preloaded these calls reach its own cudaMalloc/cudaFree, as the program's do.
DELTA_EXPORT void* delta_torch_malloc(ptrdiff_t size, int, void*) {
  // Through the interposed cudaMalloc: managed when the shim manages that size, passed to the
  // runtime otherwise, and the same with the shim disabled.
  void* pointer = nullptr;
  if (size <= 0) return nullptr;
  return cudaMalloc(&pointer, static_cast<size_t>(size)) == cudaSuccess ? pointer : nullptr;
}

DELTA_EXPORT void delta_torch_free(void* ptr, ptrdiff_t, int, void*) {
  if (ptr != nullptr) cudaFree(ptr);
}
