// The sample trace: see sample_trace.h. A made-up iteration of a two-layer net on two streams:
// weights persist, activations come and go, one activation is swapped out and prefetched back,
// one is dropped and recomputed, the budget shrinks once, and one launch is over budget.
#include "tests/trace/sample_trace.h"

#include <cstdint>

#include "trace/trace_writer.h"

namespace delta::trace::testing {

namespace {

constexpr std::uint64_t kMiB = 1 << 20;
std::uint64_t at(std::uint64_t us) { return kSampleStartNs + us * 1000; }

}  // namespace

std::string writeSampleTrace(const std::string& path) {
  TraceWriter w;
  WriterOptions o;
  o.path = path;
  o.overwrite = true;
  o.flush_interval_ms = 60000;  // one data chunk: deterministic layout
  TraceInfo info;
  info.producer = "libdelta 0.1.0";
  info.device_name = "CPU platform (cudasim)";
  info.device_memory = 1024 * kMiB;
  info.budget = 96 * kMiB;
  info.policy = "delta";
  info.options = "DELTA_BUDGET=96M\nDELTA_POLICY=delta";
  info.start_realtime_ns = 1'700'000'000'000'000'000ull;
  info.start_monotonic_ns = kSampleStartNs;
  info.pid = 4242;
  info.rank = 0;
  if (std::string err = w.open(o, info); !err.empty()) return err;

  const std::uint32_t gemm = w.internString("gemm_kernel");
  const std::uint32_t relu = w.internString("relu_kernel");
  const std::uint32_t loss = w.internString("loss_kernel");
  const std::uint32_t plan = w.internString("recompute-only/on-demand");
  const std::uint64_t frames[] = {0x401000, 0x402000, 0x403000};
  const std::uint32_t stack = w.internStack(frames);
  const std::uint64_t s1 = 0x10, s2 = 0x20;

  w.iteration({at(0), 0});
  w.alloc({at(1), 1, 0x7000000000, 32 * kMiB, s1, stack, kAllocManaged});  // weight 1
  w.alloc({at(2), 2, 0x7002000000, 32 * kMiB, s1, stack, kAllocManaged});  // weight 2
  w.alloc({at(3), 3, 0x7004000000, 16 * kMiB, s1, 0, kAllocManaged});      // activation 1
  w.alloc({at(4), 9, 0x7100000000, 1 * kMiB, 0, 0, 0});                    // unmanaged
  w.copy({at(5), 16 * kMiB, s1, 3, 0, CopyKind::kHostToDevice});
  const std::uint64_t l1[] = {1, 3};
  w.launch({at(10), s1, gemm, {64, 1, 1}, {256, 1, 1}, kLaunchAnalysed, l1});
  w.alloc({at(20), 4, 0x7005000000, 16 * kMiB, s1, 0, kAllocManaged});  // activation 2
  w.memset({at(21), 4, 16 * kMiB, s1});
  const std::uint64_t l2[] = {3, 4};
  w.launch({at(30), s1, relu, {64, 1, 1}, {256, 1, 1}, kLaunchAnalysed, l2});
  w.budgetChange({at(35), 64 * kMiB});
  // Weight 1 is swapped out, activation 1 dropped, to make room.
  w.evict({at(40), at(140), 1, 32 * kMiB, 60'000, s2, gemm, 0});
  w.evict({at(45), at(46), 3, 16 * kMiB, 0, s2, 0, kEvictDrop});
  w.alloc({at(50), 5, 0x7006000000, 16 * kMiB, s1, 0, kAllocManaged});
  const std::uint64_t l3[] = {2, 4, 5};
  w.launch({at(150), s1, gemm, {128, 1, 1}, {256, 1, 1}, kLaunchAnalysed, l3});
  const std::uint64_t l4[] = {5};
  w.launch({at(200), s2, loss, {1, 1, 1}, {32, 1, 1}, 0, l4});  // not analysed
  w.overBudget({at(210), loss, 80 * kMiB, 64 * kMiB});
  // Backward: activation 1 recomputed, weight 1 prefetched back.
  w.recompute({at(220), at(260), 3, 16 * kMiB, 40'000, s1, relu, 0});
  w.restore({at(230), at(330), 1, 32 * kMiB, 0, s2, 0, kRestorePrefetched});
  const std::uint64_t l5[] = {1, 3, 5};
  w.launch({at(340), s1, gemm, {128, 1, 1}, {256, 1, 1}, kLaunchAnalysed, l5});
  w.free({at(350), 5, 16 * kMiB, Residency::kResident});
  w.free({at(351), 4, 16 * kMiB, Residency::kResident});
  w.free({at(352), 3, 16 * kMiB, Residency::kResident});
  w.iteration({at(400), 1});
  // The planner thread's plan for the iteration learned, handed over after the boundary.
  w.plan({at(405), 2'500'000, 380'000, 5, plan, 1});
  w.free({at(410), 9, 1 * kMiB, Residency::kUnmanaged});

  CloseTotals t;
  t.peak_resident = 112 * kMiB;
  t.bytes_h2d = 32 * kMiB;
  t.bytes_d2h = 32 * kMiB;
  t.evictions = 2;
  t.restores = 1;
  t.recomputes = 1;
  t.stall_ns = 100'000;
  t.over_budget_launches = 1;
  w.close(t, at(500));
  return {};
}

}  // namespace delta::trace::testing
