// delta-play: a recorded training trace played as a CUDA program, the way a framework drives a
// GPU, so that libdelta.so can be measured on it (LD_PRELOAD) beside `delta-trace replay`'s
// prediction for the same trace. docs/delta-play.md has the long form.
//
// The trace is read through the same workload model as the replay (tools/trace_loader: DTR op
// logs, the shim's own traces). Every storage is one cudaMalloc; every op one cudaLaunchKernel on
// one stream, its buffers as pointer parameters, taking the op's logged time on the device
// (cudasimKernelTime); the host runs ahead and synchronises once per iteration. Every op stamps
// its results with a token (its serial) at the start, middle and end of each, and checks the
// tokens of its inputs against the op that must have written them last (tools/play/play_plan.h):
// under the shim, that proves nothing was lost, restored stale or recomputed wrong.
//
// Frees: a buffer the shim manages is freed at its last release, as the trace says (the shim's
// cudaFree does not wait for the device). Any other cudaFree waits for the whole device, which
// no framework lets happen in a training step: that memory is kept and reused for the next
// buffer of the same size, as a caching allocator does, so that the host stays ahead.
//
// --recompute: every result the trace says can be recomputed is registered through delta.h with
// its op's time as the cost; the callback launches the producing op again for that one result,
// whose inputs come back through the shim. Inputs a registered result needs are kept alive, and
// a buffer about to be written in place first takes its dependents' and its own registrations
// away, as a framework's recompute graph does.
//
// Usage: delta-play [options] TRACE. The last line is exactly
//   delta-play: steady_ns=N peak_bytes=N tokens=HEX16 iterations=N
// Exit 0 when every token matched; 1 after one line naming the buffer, op and iteration of the
// first mismatch; 2 for bad arguments or an unreadable trace.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "shim/include/delta/delta.h"
#include "tools/play/play_plan.h"
#include "tools/played_sizes.h"
#include "tools/trace_loader.h"
#ifdef DELTA_PLAY_CUDA
#include "tools/play/play_kernel.h"  // the real-CUDA build: kernels in play_kernels.cu
#else
#include <cudasim/cudasim.h>
#endif

namespace {

using delta::play::Param;
using delta::play::PlayPlan;
using delta::play::Role;
using delta::policy::BufferId;

struct Options {
  std::string trace;
  uint32_t iterations = 3;
  uint32_t warmup = 1;
  uint64_t scale = 1;
  double h2dGbps = 12;
  double d2hGbps = 12;
  bool recompute = false;
  bool iterationMarks = true;  // tell libdelta.so where iterations start (delta_mark_iteration)
  int64_t breakOp = -1;  // tests: this op stamps a wrong token, to show that it is caught
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "delta-play: %s\n"
               "usage: delta-play [--iterations N] [--warmup N] [--scale N] [--h2d-gbps X] "
               "[--d2h-gbps X] [--recompute] [--no-iteration-marks] TRACE\n"
               "  TRACE        a DTR op log (JSON lines, gzip or not) or a trace written by "
               "libdelta.so (DELTA_TRACE)\n"
               "  --iterations total iterations played (default 3); --warmup: the first N not "
               "measured (default 1)\n"
               "  --scale N    every size divided by N (default 1); copies slowed by N too, so that "
               "times stay the real job's\n"
               "  --h2d-gbps, --d2h-gbps  the real job's host link, GB/s (default 12): cudasim is "
               "given it divided by --scale\n"
               "  --recompute  register every recomputable result with libdelta.so (delta.h)\n"
               "  --no-iteration-marks  do not call delta_mark_iteration: the shim must find the "
               "iterations itself, as in a program that does not mark them\n",
               why.c_str());
  std::exit(2);
}

[[noreturn]] void cudaFailed(const char* call, cudaError_t error) {
  std::fprintf(stderr, "delta-play: %s failed: %s\n", call, cudaGetErrorString(error));
  std::exit(1);
}
#define CHECK(call)                                     \
  do {                                                  \
    if (cudaError_t e_ = (call); e_ != cudaSuccess) cudaFailed(#call, e_); \
  } while (0)

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// cudasim's running total of host work past its modeled time; a GPU has none.
int64_t hostOverrunNs() {
#ifdef DELTA_PLAY_CUDA
  return 0;
#else
  return cudasimTimingOverrunNs();
#endif
}

// ---- what the kernels see ---------------------------------------------------------------------

// The kernel parameters: op, iteration, the one result to write (recompute; -1: every one), then
// one pointer per buffer of the op (nullptr: not passed, in a recompute).
constexpr int kHeaderParams = 3;

struct Shared {
  const PlayPlan* plan = nullptr;
  std::vector<uint64_t> bytes;        // per buffer, scaled
  std::atomic<uint64_t> checksum{0};  // of every token read, in any order
  std::atomic<bool> failed{false};
  std::mutex failureMutex;
  std::string failure;
  int64_t breakOp = -1;
};
Shared gShared;

void fail(const std::string& what) {
  std::lock_guard lock(gShared.failureMutex);
  if (!gShared.failed.exchange(true)) gShared.failure = what;
}

std::string describeMismatch(size_t op, size_t k, uint32_t iteration, bool recomputing,
                             uint64_t offset, uint64_t found, uint64_t expected) {
  const PlayPlan& plan = *gShared.plan;
  const Param& p = plan.op(op).params[k];
  char text[512];
  std::snprintf(text, sizeof text,
                "token mismatch: buffer %s (%" PRIu64 " bytes), byte %" PRIu64
                ", read by op %zu (%s) in iteration %u%s: expected the write of op %d%s, found "
                "%016" PRIx64 " instead of %016" PRIx64,
                plan.workload().buffers[p.buffer].name.c_str(), gShared.bytes[p.buffer], offset, op,
                plan.workload().ops[op].name.c_str(), iteration, recomputing ? " (recomputing)" : "",
                p.producer, p.previousIteration ? " of the iteration before" : "", found, expected);
  return text;
}

// The token an output of `op` gets in `iteration` (tests may ask for a wrong one).
uint64_t stampOf(size_t op, uint32_t iteration, BufferId buffer) {
  uint64_t stamp = PlayPlan::token(gShared.plan->serial(iteration, op), buffer);
  if (static_cast<int64_t>(op) == gShared.breakOp) stamp ^= 1;
  return stamp;
}

#ifndef DELTA_PLAY_CUDA
void opBody(void** params, dim3, dim3) {
  const auto op = static_cast<size_t>(*static_cast<uint64_t*>(params[0]));
  const auto iteration = static_cast<uint32_t>(*static_cast<uint64_t*>(params[1]));
  const int64_t only = *static_cast<int64_t*>(params[2]);
  const PlayPlan& plan = *gShared.plan;
  const delta::policy::WorkloadOp& workOp = plan.workload().ops[op];
  const std::vector<Param>& list = plan.op(op).params;
  uint64_t sum = 0;
  for (size_t k = 0; k < list.size(); ++k) {
    const Param& p = list[k];
    auto* buffer = *static_cast<unsigned char**>(params[kHeaderParams + k]);
    if (buffer == nullptr) continue;
    const bool recomputing = only >= 0;
    // A recompute regenerates one result from the op's inputs: it neither checks nor stamps
    // what the op wrote in place, nor its other results.
    if (recomputing && p.role == Role::kWrite) continue;
    if (recomputing && p.role == Role::kAlloc && static_cast<int64_t>(k) != only) continue;
    const uint64_t bytes = gShared.bytes[p.buffer];
    const std::vector<uint64_t> offsets = PlayPlan::tokenOffsets(bytes);
    if (p.role != Role::kAlloc) {
      const uint64_t expected = PlayPlan::token(plan.expected(iteration, p), p.buffer);
      for (uint64_t offset : offsets) {
        uint64_t found;
        std::memcpy(&found, buffer + offset, 8);
        // What a recompute reads again is not counted: the checksum is the program's reads.
        if (!recomputing) sum += found * (offset + 1);
        if (found != expected && !gShared.failed.load(std::memory_order_relaxed))
          fail(describeMismatch(op, k, iteration, recomputing, offset, found, expected));
      }
    }
    if (p.role != Role::kRead) {
      const uint64_t stamp = stampOf(op, iteration, p.buffer);
      for (uint64_t offset : offsets) std::memcpy(buffer + offset, &stamp, 8);
    }
  }
  gShared.checksum.fetch_add(sum, std::memory_order_relaxed);
  if (!(only >= 0 && workOp.compute_ns <= 0)) cudasimKernelTime(workOp.compute_ns);
}

// Persistent buffers start stamped with serial 0.
void initBody(void** params, dim3, dim3) {
  auto* buffer = *static_cast<unsigned char**>(params[0]);
  const auto id = static_cast<BufferId>(*static_cast<uint64_t*>(params[1]));
  const uint64_t stamp = PlayPlan::token(0, id);
  for (uint64_t offset : PlayPlan::tokenOffsets(gShared.bytes[id])) std::memcpy(buffer + offset, &stamp, 8);
}

// One kernel per (op name, parameter count): the shim's traces then name the trace's ops.
char gSymbols[1 << 16];
char gInitSymbol;
#endif  // !DELTA_PLAY_CUDA

// ---- the player ---------------------------------------------------------------------------------

class Player {
 public:
  Player(const Options& options, const PlayPlan& plan) : o_(options), plan_(plan) {
    const auto& w = plan.workload();
    ptr_.assign(w.buffers.size(), nullptr);
    programFreed_.assign(w.buffers.size(), false);
    holds_.assign(w.buffers.size(), 0);
    registered_.assign(w.buffers.size(), false);
    iterationOf_.assign(w.buffers.size(), 0);
    if (void* f = dlsym(RTLD_DEFAULT, "delta_is_dropped"))
      isDropped_ = reinterpret_cast<int (*)(const void*)>(f);
    // Where iterations start, as a framework's training loop says it (delta learns from it).
    if (void* f = dlsym(RTLD_DEFAULT, "delta_mark_iteration"); f != nullptr && options.iterationMarks)
      markIteration_ = reinterpret_cast<int (*)()>(f);
    if (options.recompute) {
      if (void* f = dlsym(RTLD_DEFAULT, "delta_register_recompute"))
        register_ = reinterpret_cast<decltype(register_)>(f);
      if (void* f = dlsym(RTLD_DEFAULT, "delta_unregister"))
        unregister_ = reinterpret_cast<int (*)(const void*)>(f);
    }
    registerKernels();
  }

  int run() {
#ifdef DELTA_PLAY_CUDA
    // The op's time in cycles of clock64(), and the report the kernels write into host memory.
    int clockKhz = 0;
    CHECK(cudaDeviceGetAttribute(&clockKhz, cudaDevAttrClockRate, 0));
    cyclesPerNs_ = clockKhz / 1e6;
    CHECK(cudaHostAlloc(reinterpret_cast<void**>(&report_), sizeof *report_, cudaHostAllocMapped));
    *report_ = delta::play::PlayReport{};
#endif
    // A blocking stream: what the shim does on the legacy default stream (regenerating a buffer
    // as it is unregistered) is ordered with the play's work both ways.
    CHECK(cudaStreamCreate(&stream_));
    const auto& w = plan_.workload();
    for (BufferId b = 0; b < w.buffers.size(); ++b) {
      if (!w.buffers[b].persistent) continue;
      allocate(b);
#ifdef DELTA_PLAY_CUDA
      CHECK(deltaPlayLaunchInit(ptr_[b], gShared.bytes[b], PlayPlan::token(0, b), stream_));
#else
      uint64_t id = b;
      void* args[] = {&ptr_[b], &id};
      CHECK(cudaLaunchKernel(&gInitSymbol, dim3(1), dim3(1), args, 0, stream_));
#endif
    }
    CHECK(cudaStreamSynchronize(stream_));
    double measured = 0;
    int64_t measuredOverrunNs = 0;  // cudasim: host work past its modeled time, in those
    for (uint32_t i = 0; i < o_.iterations; ++i) {
      const int64_t overrunBefore = hostOverrunNs();
      const int64_t start = nowNs();
      if (markIteration_ != nullptr) markIteration_();
      for (size_t op = 0; op < plan_.ops(); ++op) step(i, op);
      CHECK(cudaStreamSynchronize(stream_));
      const int64_t ns = nowNs() - start;
#ifdef DELTA_PLAY_CUDA
      if (report_->failed)
        fail(describeMismatch(report_->op, report_->param, static_cast<uint32_t>(report_->iteration),
                              false, report_->offset, report_->found, report_->expected));
      gShared.checksum.store(report_->checksum);
#endif
      if (gShared.failed.load()) {
        std::fprintf(stderr, "delta-play: %s\n", gShared.failure.c_str());
        return 1;
      }
      std::printf("iteration_%u_ns: %lld%s\n", i, static_cast<long long>(ns), i < o_.warmup ? " (warm-up)" : "");
      if (i >= o_.warmup) {
        measured += static_cast<double>(ns);
        measuredOverrunNs += hostOverrunNs() - overrunBefore;
      }
    }
    const uint32_t counted = o_.iterations - o_.warmup;
#ifndef DELTA_PLAY_CUDA
    // How much of steady_ns this machine may account for rather than the model
    // (docs/delta-play.md).
    std::printf("steady_host_overrun_ns: %lld\n",
                static_cast<long long>(measuredOverrunNs / counted));
#endif
    std::printf("delta-play: steady_ns=%lld peak_bytes=%llu tokens=%016llx iterations=%u\n",
                static_cast<long long>(std::llround(measured / counted)),
                static_cast<unsigned long long>(peak_),
                static_cast<unsigned long long>(gShared.checksum.load()), o_.iterations);
    return 0;
  }

 private:
  void registerKernels() {
#ifdef DELTA_PLAY_CUDA
    if (plan_.maxParams() > static_cast<size_t>(delta::play::kMaxKernelBuffers)) {
      std::fprintf(stderr, "delta-play: an op of this trace touches %zu buffers; the CUDA build passes "
                   "at most %d by value\n", plan_.maxParams(), delta::play::kMaxKernelBuffers);
      std::exit(2);
    }
#else
    const auto& w = plan_.workload();
    std::map<std::pair<std::string, size_t>, const void*> symbols;
    symbol_.resize(plan_.ops());
    size_t next = 0;
    for (size_t op = 0; op < plan_.ops(); ++op) {
      const size_t count = plan_.op(op).params.size();
      auto [it, inserted] = symbols.try_emplace({w.ops[op].name, count}, nullptr);
      if (inserted) {
        if (next >= sizeof gSymbols) {
          std::fprintf(stderr, "delta-play: more than %zu distinct kernels\n", sizeof gSymbols);
          std::exit(2);
        }
        it->second = &gSymbols[next++];
        std::vector<size_t> sizes(kHeaderParams + count, 8);
        cudasimRegisterKernel(it->second, w.ops[op].name.empty() ? "play_op" : w.ops[op].name.c_str(),
                              opBody, static_cast<int>(sizes.size()), sizes.data());
      }
      symbol_[op] = it->second;
    }
    static const size_t init[] = {8, 8};
    cudasimRegisterKernel(&gInitSymbol, "play_init", initBody, 2, init);
#endif
  }

  void allocate(BufferId b) {
    const uint64_t bytes = gShared.bytes[b];
    if (auto cached = cache_.find(bytes); cached != cache_.end()) {
      ptr_[b] = cached->second;
      cache_.erase(cached);
    } else {
      CHECK(cudaMalloc(&ptr_[b], bytes));
    }
    live_ += bytes;
    peak_ = std::max(peak_, live_);
  }

  void launch(size_t op, uint32_t iteration, int64_t only, cudaStream_t stream) {
    const std::vector<Param>& list = plan_.op(op).params;
#ifdef DELTA_PLAY_CUDA
    delta::play::PlayOpArgs args;
    args.op = op;
    args.iteration = iteration;
    args.only = only;
    args.count = static_cast<uint32_t>(list.size());
    const int64_t ns = plan_.workload().ops[op].compute_ns;
    args.cycles = static_cast<int64_t>(static_cast<double>(std::max<int64_t>(ns, 0)) * cyclesPerNs_);
    for (size_t k = 0; k < list.size(); ++k) {
      const Param& p = list[k];
      const bool passed = only < 0 || (p.role == Role::kRead) || static_cast<int64_t>(k) == only;
      args.ptr[k] = passed ? static_cast<unsigned char*>(ptr_[p.buffer]) : nullptr;
      args.bytes[k] = gShared.bytes[p.buffer];
      args.role[k] = p.role == Role::kRead    ? delta::play::kKernelRead
                     : p.role == Role::kWrite ? delta::play::kKernelWrite
                                              : delta::play::kKernelAlloc;
      if (p.role != Role::kAlloc) args.expected[k] = PlayPlan::token(plan_.expected(iteration, p), p.buffer);
      if (p.role != Role::kRead) args.stamp[k] = stampOf(op, iteration, p.buffer);
    }
    CHECK(deltaPlayLaunchOp(&args, report_, stream));
#else
    std::vector<uint64_t> header{op, iteration, static_cast<uint64_t>(only)};
    std::vector<void*> pointers(list.size());
    for (size_t k = 0; k < list.size(); ++k) {
      const Param& p = list[k];
      const bool passed = only < 0 || (p.role == Role::kRead) || static_cast<int64_t>(k) == only;
      pointers[k] = passed ? ptr_[p.buffer] : nullptr;
    }
    std::vector<void*> args(kHeaderParams + list.size());
    for (int k = 0; k < kHeaderParams; ++k) args[k] = &header[k];
    for (size_t k = 0; k < list.size(); ++k) args[kHeaderParams + k] = &pointers[k];
    CHECK(cudaLaunchKernel(symbol_[op], dim3(1), dim3(1), args.data(), 0, stream));
#endif
  }

  void step(uint32_t iteration, size_t op) {
    const delta::policy::WorkloadOp& workOp = plan_.workload().ops[op];
    if (register_ != nullptr) {
      // Written in place: what was computed from it, and it itself, can no longer be
      // recomputed; regenerated now if dropped, while the inputs are still as they were.
      for (BufferId w : workOp.writes) {
        for (BufferId d : plan_.dependents(w))
          if (registered_[d]) unregisterRecompute(d);
        if (registered_[w]) unregisterRecompute(w);
      }
    }
    for (const Param& p : plan_.op(op).params)
      if (p.role == Role::kAlloc) allocate(p.buffer);
    launch(op, iteration, -1, stream_);
    if (register_ != nullptr) {
      for (const Param& p : plan_.op(op).params)
        if (p.role == Role::kAlloc && plan_.recomputable(p.buffer)) registerRecompute(p.buffer, iteration);
    }
    for (BufferId b : workOp.frees) programFree(b);
  }

  // ---- recompute ----
  struct Callback {
    Player* player;
    BufferId buffer;
  };
  static int recomputeCallback(void* context, void*, size_t, void* stream) {
    auto* callback = static_cast<Callback*>(context);
    Player& self = *callback->player;
    const BufferId b = callback->buffer;
    const auto producer = static_cast<size_t>(self.plan_.workload().buffers[b].producer);
    const std::vector<Param>& list = self.plan_.op(producer).params;
    int64_t only = -1;
    for (size_t k = 0; k < list.size(); ++k)
      if (list[k].buffer == b) only = static_cast<int64_t>(k);
    self.launch(producer, self.iterationOf_[b], only, static_cast<cudaStream_t>(stream));
    return 0;
  }
  void registerRecompute(BufferId b, uint32_t iteration) {
    callbacks_.resize(plan_.workload().buffers.size());
    callbacks_[b] = Callback{this, b};
    const int64_t cost = plan_.workload().buffers[b].recompute_ns;
    if (register_(ptr_[b], static_cast<uint64_t>(std::max<int64_t>(cost, 0)), recomputeCallback,
                  &callbacks_[b]) != 0)
      return;  // not a managed buffer: nothing to drop
    registered_[b] = true;
    iterationOf_[b] = iteration;
    for (BufferId input : plan_.producerInputs(b)) ++holds_[input];
  }
  void unregisterRecompute(BufferId b) {
    if (!registered_[b]) return;
    if (unregister_ != nullptr) unregister_(ptr_[b]);
    forgetRecompute(b);
  }
  // The player's side of a registration ending: its inputs are no longer held for it.
  void forgetRecompute(BufferId b) {
    registered_[b] = false;
    for (BufferId input : plan_.producerInputs(b)) release(input);
  }

  // ---- frees ----
  void programFree(BufferId b) {
    programFreed_[b] = true;
    if (holds_[b] == 0) {
      // Freed now: the free takes the registration with it (delta_unregister would first
      // regenerate a dropped buffer, only for it to be freed).
      if (registered_[b]) forgetRecompute(b);
      freeNow(b);
      return;
    }
    // Kept for the results that need it: no longer the program's, so no longer registered
    // (what it was computed from may go), and regenerated now if it was dropped.
    if (registered_[b]) unregisterRecompute(b);
  }
  void release(BufferId b) {
    if (holds_[b] > 0 && --holds_[b] == 0 && programFreed_[b]) freeNow(b);
  }
  void freeNow(BufferId b) {
    programFreed_[b] = false;
    live_ -= gShared.bytes[b];
    // The shim frees what it manages without waiting for the device; any other cudaFree waits
    // for all of it, which no framework lets happen in a training step: that memory is kept for
    // the next buffer of its size, as a caching allocator does (one stream: the next user's work
    // runs after the last one's).
    if (isDropped_ != nullptr && isDropped_(ptr_[b]) >= 0) CHECK(cudaFree(ptr_[b]));
    else cache_.emplace(gShared.bytes[b], ptr_[b]);
    ptr_[b] = nullptr;
  }

  const Options o_;
  const PlayPlan& plan_;
  cudaStream_t stream_ = nullptr;
  std::vector<const void*> symbol_;
  std::vector<void*> ptr_;
  std::vector<bool> programFreed_;
  std::vector<uint32_t> holds_;  // registered results whose recompute needs this buffer
  std::vector<bool> registered_;
  std::vector<uint32_t> iterationOf_;
  std::vector<Callback> callbacks_;
  std::multimap<uint64_t, void*> cache_;  // unmanaged memory kept for reuse, by size
  uint64_t live_ = 0;
  uint64_t peak_ = 0;
  int (*isDropped_)(const void*) = nullptr;
  int (*markIteration_)() = nullptr;
#ifdef DELTA_PLAY_CUDA
  double cyclesPerNs_ = 1;
  delta::play::PlayReport* report_ = nullptr;  // mapped host memory
#endif
  int (*register_)(const void*, uint64_t, delta_recompute_fn, void*) = nullptr;
  int (*unregister_)(const void*) = nullptr;
};

bool parseNumber(const std::string& text, double* out) {
  char* end = nullptr;
  *out = std::strtod(text.c_str(), &end);
  return !text.empty() && end != text.c_str() && *end == '\0' && std::isfinite(*out) && *out >= 0;
}

#ifndef DELTA_PLAY_CUDA
// The bandwidth cudasim must be given for the scaled job to take the real job's times.
void setLink(const char* variable, double realGbps, uint64_t scale) {
  if (const char* given = std::getenv(variable); given != nullptr && *given != '\0') {
    std::printf("link: %s=%s as given (the real job's %.3f GB/s at scale %llu would be %.6g)\n",
                variable, given, realGbps, static_cast<unsigned long long>(scale), realGbps / scale);
    return;
  }
  char value[64];
  std::snprintf(value, sizeof value, "%.9g", realGbps / static_cast<double>(scale));
  setenv(variable, value, 1);
  std::printf("link: %s=%s (%.3f GB/s divided by the scale)\n", variable, value, realGbps);
}

// cudasim writes device memory and pins host memory once at start (not timed), so that the
// timed iterations pay neither for the first touch of a device page nor for pinning host memory
// page by page, which a virtual machine can make tens of times slower than a GPU machine does
// (docs/delta-play.md, Host speed). Device memory: the played peak and a half, as a shim's pools
// and fragmentation reach past what the trace holds at once; host memory: the played peak,
// more than a shim ever evicts. Each with 256 MiB more.
void setWarm(const char* variable, uint64_t bytes, const char* why) {
  if (const char* given = std::getenv(variable); given != nullptr && *given != '\0') {
    std::printf("warm: %s=%s as given\n", variable, given);
    return;
  }
  setenv(variable, std::to_string(bytes).c_str(), 1);
  std::printf("warm: %s=%llu (%s, and 256 MiB)\n", variable,
              static_cast<unsigned long long>(bytes), why);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value for " + arg);
      return argv[++i];
    };
    double number = 0;
    if (arg == "--recompute") {
      o.recompute = true;
    } else if (arg == "--no-iteration-marks") {
      o.iterationMarks = false;
    } else if (arg == "--iterations" || arg == "--warmup" || arg == "--scale" || arg == "--break-token") {
      const std::string v = value();
      if (!parseNumber(v, &number) || number != std::floor(number) || number > 1e9)
        usage("bad value for " + arg + ": " + v + " (a whole number)");
      if (arg == "--iterations") o.iterations = static_cast<uint32_t>(number);
      else if (arg == "--warmup") o.warmup = static_cast<uint32_t>(number);
      else if (arg == "--scale") o.scale = static_cast<uint64_t>(number);
      else o.breakOp = static_cast<int64_t>(number);
    } else if (arg == "--h2d-gbps" || arg == "--d2h-gbps") {
      const std::string v = value();
      if (!parseNumber(v, &number) || number <= 0 || number > 1e6)
        usage("bad value for " + arg + ": " + v + " (GB/s, a positive number)");
      (arg == "--h2d-gbps" ? o.h2dGbps : o.d2hGbps) = number;
    } else if (!arg.empty() && arg[0] == '-') {
      usage("unknown option " + arg);
    } else if (o.trace.empty()) {
      o.trace = arg;
    } else {
      usage("one trace at a time (" + o.trace + ", then " + arg + ")");
    }
  }
  if (o.trace.empty()) usage("no trace given");
  if (o.scale == 0) usage("--scale must be at least 1");
  if (o.iterations == 0 || o.warmup >= o.iterations)
    usage("--iterations must be more than --warmup (at least one measured iteration)");

  delta::policy::ImportResult imported = delta::tools::loadWorkload(o.trace);
  if (!imported.error.empty()) {
    std::fprintf(stderr, "delta-play: %s\n", imported.error.c_str());
    return 2;
  }
  const delta::policy::Workload& workload = imported.workload;
  if (std::string problem = workload.validate(); !problem.empty()) {
    std::fprintf(stderr, "delta-play: %s: the trace is not consistent: %s\n", o.trace.c_str(),
                 problem.c_str());
    return 2;
  }
  const PlayPlan plan(workload);
  gShared.plan = &plan;
  gShared.breakOp = o.breakOp;
  // Every size as played; what a budget must be measured against is the peak as played
  // (DELTA_BUDGET is in those bytes).
  const delta::policy::Workload played = delta::tools::played(workload, o.scale);
  gShared.bytes.resize(workload.buffers.size());
  for (BufferId b = 0; b < workload.buffers.size(); ++b) gShared.bytes[b] = played.buffers[b].bytes;
  const uint64_t playedPeak = played.peakBytes();
  // What scaling does to a memory shim: buffers that fall below its 1 MiB threshold (left
  // unmanaged) and the 2 MiB granularity each managed one is rounded to, as shares of all the
  // bytes the trace allocates; neither scales with the trace.
  uint64_t allBytes = 0, smallBytes = 0, roundingBytes = 0;
  for (BufferId b = 0; b < workload.buffers.size(); ++b) {
    const uint64_t bytes = gShared.bytes[b];
    allBytes += bytes;
    if (bytes < (1u << 20)) smallBytes += bytes;
    else roundingBytes += (bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20) - bytes;
  }
  std::printf("trace: %s\nops: %zu\nbuffers: %zu\ntrace_peak_bytes: %llu\ncompute_ns: %lld\n"
              "scale: %llu\nplayed_peak_bytes: %llu\nplayed_below_1mib_pct: %.1f\n"
              "played_rounding_to_2mib_pct: %.1f\n",
              o.trace.c_str(), workload.ops.size(), workload.buffers.size(),
              static_cast<unsigned long long>(workload.peakBytes()),
              static_cast<long long>(workload.computeNs()), static_cast<unsigned long long>(o.scale),
              static_cast<unsigned long long>(playedPeak),
              allBytes ? 100.0 * static_cast<double>(smallBytes) / static_cast<double>(allBytes) : 0.0,
              allBytes ? 100.0 * static_cast<double>(roundingBytes) / static_cast<double>(allBytes) : 0.0);
#ifdef DELTA_PLAY_CUDA
  std::printf("link: the GPU's own (--h2d-gbps and --d2h-gbps are for cudasim)\n");
#else
  // Before the first CUDA call: cudasim reads its bandwidths when the driver starts.
  setLink("CUDASIM_H2D_GBPS", o.h2dGbps, o.scale);
  setLink("CUDASIM_D2H_GBPS", o.d2hGbps, o.scale);
  setWarm("CUDASIM_WARM_MEMORY", playedPeak + playedPeak / 2 + (256ull << 20),
          "the played peak and a half");
  setWarm("CUDASIM_WARM_HOST_MEMORY", playedPeak + (256ull << 20), "the played peak");
#endif
  std::fflush(stdout);
  Player player(o, plan);
  const int status = player.run();
  std::fflush(stdout);
  return status;
}
