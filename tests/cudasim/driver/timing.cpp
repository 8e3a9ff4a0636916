// GPU time on cudasim: see timing.h.
#include "timing.h"

#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace cudasim {
namespace {

[[noreturn]] void badEnvironment(const char* variable, const char* value, const char* accepted) {
  std::fprintf(stderr, "cudasim: %s='%s' is not valid: %s\n", variable, value, accepted);
  std::exit(2);
}

// GB/s as bytes per nanosecond (1 GB/s = 1 byte/ns); `fallback` when unset or empty.
double bandwidthFromEnvironment(const char* variable, double fallback, bool zeroAllowed) {
  const char* text = std::getenv(variable);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || errno != 0 || !std::isfinite(value) || value < 0 ||
      (value == 0 && !zeroAllowed) || value > 1e6)
    badEnvironment(variable, text,
                   zeroAllowed ? "a bandwidth in GB/s (decimals allowed, at most 1e6), 0 for untimed"
                               : "a positive bandwidth in GB/s (decimals allowed, at most 1e6)");
  return value;
}

thread_local int64_t tDeclaredKernelNs = 0;

const char* engineName(int engine) {
  switch (static_cast<Engine>(engine)) {
    case Engine::kCompute: return "compute";
    case Engine::kHostToDevice: return "host-to-device";
    case Engine::kDeviceToHost: return "device-to-host";
    case Engine::kNone: break;
  }
  return "none";
}

}  // namespace

int64_t monotonicNs() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return int64_t(now.tv_sec) * 1000000000 + now.tv_nsec;
}

Timing::Timing() {
  h2dBytesPerNs_ = bandwidthFromEnvironment("CUDASIM_H2D_GBPS", 0, true);
  d2hBytesPerNs_ = bandwidthFromEnvironment("CUDASIM_D2H_GBPS", 0, true);
  d2dBytesPerNs_ = bandwidthFromEnvironment("CUDASIM_D2D_GBPS", 1000, false);
  const char* verbose = std::getenv("CUDASIM_VERBOSE");
  verbose_ = verbose != nullptr && verbose[0] == '1' && verbose[1] == '\0';
  if (verbose != nullptr && *verbose != '\0' && !verbose_ && !(verbose[0] == '0' && verbose[1] == '\0'))
    badEnvironment("CUDASIM_VERBOSE", verbose, "0 or 1");
  if (verbose_) std::atexit([] { timing().report(); });
}

int64_t Timing::copyNs(Engine engine, uint64_t bytes, bool pageable) const {
  if (!copiesTimed() || bytes == 0) return 0;
  double bytesPerNs = 0;
  switch (engine) {
    case Engine::kHostToDevice: bytesPerNs = h2dBytesPerNs_; break;
    case Engine::kDeviceToHost: bytesPerNs = d2hBytesPerNs_; break;
    case Engine::kCompute: bytesPerNs = d2dBytesPerNs_; break;
    case Engine::kNone: return 0;
  }
  if (bytesPerNs <= 0) return 0;  // that direction left untimed
  // Pageable memory goes through the driver's staging buffers: half the bandwidth.
  if (pageable) bytesPerNs /= 2;
  return static_cast<int64_t>(std::ceil(static_cast<double>(bytes) / bytesPerNs));
}

int64_t Timing::finish(Engine engine, int64_t readyNs, int64_t hostStartNs, int64_t durationNs,
                       ReadyBy readyBy) {
  const int index = static_cast<int>(engine);
  EngineClock& clock = engines_[index];
  const int64_t hostNs = monotonicNs() - hostStartNs;
  if (hostNs > durationNs) {
    // The host work took longer than the GPU would: the item takes as long as it did.
    overruns_.fetch_add(1, std::memory_order_relaxed);
    overrunNs_.fetch_add(hostNs - durationNs, std::memory_order_relaxed);
    overrunByEngineNs_[index].fetch_add(hostNs - durationNs, std::memory_order_relaxed);
  }
  int64_t end;
  {
    std::lock_guard lock(clock.mutex);
    if (engine == Engine::kCompute && clock.freeAtNs > 0 && readyNs > clock.freeAtNs)
      idleNs_[static_cast<int>(readyBy)].fetch_add(readyNs - clock.freeAtNs,
                                                    std::memory_order_relaxed);
    const int64_t start = std::max(readyNs, clock.freeAtNs);
    end = start + std::max(durationNs, hostNs);
    clock.freeAtNs = end;
  }
  timed_.fetch_add(1, std::memory_order_relaxed);
  busyNs_[index].fetch_add(durationNs, std::memory_order_relaxed);
  const timespec deadline{static_cast<time_t>(end / 1000000000), static_cast<long>(end % 1000000000)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &deadline, nullptr) == EINTR) {
  }
  return end;
}

void Timing::report() const {
  std::fprintf(stderr,
               "cudasim: timing: H2D %.3f GB/s, D2H %.3f GB/s, D2D %.3f GB/s; %llu items timed",
               h2dBytesPerNs_, d2hBytesPerNs_, d2dBytesPerNs_,
               static_cast<unsigned long long>(timed_.load()));
  for (int engine = 1; engine < 4; ++engine)
    std::fprintf(stderr, ", %s busy %.6f s", engineName(engine), busyNs_[engine].load() / 1e9);
  std::fprintf(stderr, "\n");
  std::fprintf(stderr,
               "cudasim: timing: compute idle between items %.6f s: %.6f s for work the host had "
               "not submitted, %.6f s after the stream's previous item (a copy), %.6f s for "
               "other streams (events)\n",
               (idleNs_[0].load() + idleNs_[1].load() + idleNs_[2].load()) / 1e9,
               idleNs_[0].load() / 1e9, idleNs_[1].load() / 1e9, idleNs_[2].load() / 1e9);
  int64_t busy = 0;
  for (const auto& engineBusy : busyNs_) busy += engineBusy.load();
  if (const uint64_t overruns = overruns_.load(); overruns > 0) {
    // A few microseconds here and there are the host's own latency on tiny items; past 1 % of
    // the modeled time, the host, not the model, set the pace.
    const double share = busy > 0 ? 100.0 * static_cast<double>(overrunNs_.load()) / busy : 100.0;
    std::fprintf(stderr,
                 "cudasim: timing: %llu items took longer on the host than their modeled time "
                 "(%.3f s in all, %.2f %% of the modeled busy time; compute %.3f s, host-to-device "
                 "%.3f s, device-to-host %.3f s)%s\n",
                 static_cast<unsigned long long>(overruns), overrunNs_.load() / 1e9, share,
                 overrunByEngineNs_[1].load() / 1e9, overrunByEngineNs_[2].load() / 1e9,
                 overrunByEngineNs_[3].load() / 1e9,
                 share > 1.0 ? ": the times of this run are not to be trusted (lower the load, or "
                               "scale the work down)"
                             : "");
  }
}

Timing& timing() {
  static Timing* instance = new Timing;  // outlives every worker thread
  return *instance;
}

void declareKernelTime(int64_t ns) { tDeclaredKernelNs = ns > 0 ? ns : 0; }

int64_t takeDeclaredKernelTime() {
  const int64_t ns = tDeclaredKernelNs;
  tDeclaredKernelNs = 0;
  return ns;
}

}  // namespace cudasim
