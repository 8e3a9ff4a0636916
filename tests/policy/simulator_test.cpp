// Simulator invariants, and the swap-must-win / recompute-must-win cases replayed end to end.
#include "policy/simulator.h"

#include <gtest/gtest.h>

#include <random>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "policy/delta_policy.h"
#include "policy/policy_factory.h"
#include "workload_builder.h"

namespace delta::policy {
namespace {

using testing::trainingWorkload;
using testing::WorkloadBuilder;

constexpr std::uint64_t kMiB = 1u << 20;

SimResult replay(const Workload& w, std::string_view name, SimOptions o) {
  EXPECT_EQ(w.validate(), "");
  PolicyConfig config;
  config.max_buffers = static_cast<std::uint32_t>(w.buffers.size());
  config.max_launches = 4096;
  config.max_uses = 1 << 16;
  config.h2d_gbps = o.h2d_gbps;
  config.d2h_gbps = o.d2h_gbps;
  config.budget_bytes = o.budget_bytes;  // delta plans its mode, as in delta-trace
  const UseSchedule future = w.schedule();
  PolicyResult p = makePolicy(name, config, &future);
  EXPECT_EQ(p.error, "");
  Simulator sim(w, o);
  return sim.run(*p.policy);
}

class EveryPolicy : public ::testing::TestWithParam<std::string_view> {};

TEST_P(EveryPolicy, UnlimitedMemoryCostsNothing) {
  const Workload w = trainingWorkload(8, 64 * kMiB, 1'000'000);
  const SimResult r = replay(w, GetParam(), SimOptions{});
  EXPECT_EQ(r.total_ns, r.compute_ns);
  EXPECT_EQ(r.compute_ns, 2 * w.computeNs());  // 3 iterations, 1 warm-up
  EXPECT_EQ(r.h2d_bytes + r.d2h_bytes, 0u);
  EXPECT_EQ(r.recompute_ns, 0);
  EXPECT_EQ(r.peak_bytes, w.peakBytes());
  EXPECT_EQ(r.over_budget_ops, 0u);
  EXPECT_DOUBLE_EQ(r.overhead_pct, 0.0);
}

TEST_P(EveryPolicy, BudgetIsKeptAndNothingIsUsedWhileEvicted) {
  const Workload w = trainingWorkload(12, 64 * kMiB, 1'000'000);
  for (double share : {0.3, 0.5, 0.7, 0.9}) {
    for (double gbps : {1.0, 12.0, 50.0}) {
      SimOptions o;
      o.budget_bytes = static_cast<std::uint64_t>(share * static_cast<double>(w.peakBytes()));
      o.h2d_gbps = o.d2h_gbps = gbps;
      const SimResult r = replay(w, GetParam(), o);
      const std::string where = std::to_string(share) + " of peak at " + std::to_string(gbps) + " GB/s";
      EXPECT_EQ(r.used_while_evicted, 0u) << where;
      if (r.over_budget_ops == 0) {
        EXPECT_LE(r.peak_bytes, o.budget_bytes) << where;
      }
      EXPECT_GE(r.total_ns, r.compute_ns + r.recompute_ns) << where;
      EXPECT_EQ(r.stall_ns, r.total_ns - r.compute_ns - r.recompute_ns) << where;
      // The policies that can evict everything fit this budget.
      if (GetParam() != "dtr" && GetParam() != "recompute-only") {
        EXPECT_EQ(r.over_budget_ops, 0u) << where;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, EveryPolicy,
                         ::testing::Values("delta", "lru", "dtr", "swap-only", "recompute-only", "belady"),
                         [](const auto& info) {
                           std::string s(info.param);
                           for (char& c : s) c = c == '-' ? '_' : c;
                           return s;
                         });

TEST(Simulator, TooSmallABudgetIsCountedNotHidden) {
  const Workload w = trainingWorkload(4, 64 * kMiB, 1'000'000);
  SimOptions o;
  o.budget_bytes = 100 * kMiB;  // less than one backward op's working set (4 x 64 MiB)
  const SimResult r = replay(w, "delta", o);
  EXPECT_GT(r.over_budget_ops, 0u);
  EXPECT_GT(r.peak_bytes, o.budget_bytes);
  EXPECT_EQ(r.used_while_evicted, 0u);
}

// A: expensive to recompute (50 ms), needed again after 200 ms of other work: the copy out and
// back (~11 ms each way at 12 GB/s) hides under compute, so delta must swap, with no stall once
// it knows the pattern (a little remains: the first copy out waits for the budget).
Workload swapWins() {
  WorkloadBuilder b;
  const BufferId in = b.persistent("in", kMiB);
  const BufferId a = b.op("expensive", 50'000'000, {in}, {128 * kMiB})[0];
  BufferId x = b.op("other0", 10'000'000, {in}, {64 * kMiB})[0];
  for (int i = 1; i < 20; ++i) {
    const BufferId y = b.op("other" + std::to_string(i), 10'000'000, {x}, {64 * kMiB})[0];
    b.free(x);
    x = y;
  }
  b.op("use", 1'000'000, {a, x});
  b.free(a);
  b.free(x);
  return b.take();
}

// B: huge and cheap (1 ms), needed again 2 ms later: moving 1 GiB takes ~90 ms each way, so
// delta must drop and recompute it.
Workload recomputeWins() {
  WorkloadBuilder b;
  const BufferId in = b.persistent("in", kMiB);
  const BufferId a = b.op("cheap", 1'000'000, {in}, {1024 * kMiB})[0];
  const BufferId t = b.op("temp", 2'000'000, {in}, {1024 * kMiB})[0];
  b.op("use_t", 1'000'000, {t});
  b.free(t);
  b.op("use_a", 1'000'000, {a});
  b.free(a);
  return b.take();
}

TEST(Simulator, TheLastIterationIsTimedAloneAsWell) {
  // The planner ranks by the measured iterations together and predicts the last one alone.
  for (std::uint32_t layers : {4u, 8u}) {
    const Workload w = trainingWorkload(layers, 64 * kMiB, 1'000'000);
    for (const char* policy : {"lru", "delta"}) {
      for (std::uint32_t iterations : {2u, 3u, 4u}) {
        SCOPED_TRACE(::testing::Message() << layers << " layers, " << policy << ", " << iterations);
        SimOptions o;
        o.budget_bytes = w.peakBytes() / 2;
        o.iterations = iterations;
        o.warmup = iterations - 1;
        const SimResult last = replay(w, policy, o);
        EXPECT_EQ(last.last_iteration_ns, last.total_ns);  // the only one measured
        o.warmup = 0;
        const SimResult all = replay(w, policy, o);
        EXPECT_EQ(all.last_iteration_ns, last.total_ns);  // the same run, measured from the start
        EXPECT_GE(all.last_iteration_ns, w.computeNs());
        EXPECT_LT(all.last_iteration_ns, all.total_ns);
      }
    }
  }
}

TEST(Simulator, GivesUpOnlyPastItsLimit) {
  const Workload w = trainingWorkload(6, 64 * kMiB, 1'000'000);
  SimOptions o;
  o.budget_bytes = w.peakBytes() / 2;
  const SimResult full = replay(w, "delta", o);
  EXPECT_FALSE(full.gave_up);
  EXPECT_GE(full.run_ns, 3 * w.computeNs());  // three iterations, warm-up included
  EXPECT_GT(full.run_ns, full.total_ns);
  o.give_up_after_ns = full.run_ns;  // reached, not passed
  EXPECT_FALSE(replay(w, "delta", o).gave_up);
  o.give_up_after_ns = full.run_ns / 3;
  const SimResult cut = replay(w, "delta", o);
  EXPECT_TRUE(cut.gave_up);
  EXPECT_GT(cut.run_ns, o.give_up_after_ns);
  EXPECT_LT(cut.run_ns, full.run_ns);  // it stopped there
}

TEST(Simulator, SwapMustWin) {
  const Workload w = swapWins();
  SimOptions o;
  o.budget_bytes = w.peakBytes() - 64 * kMiB;  // A must leave for a while
  const SimResult r = replay(w, "delta", o);
  EXPECT_EQ(r.over_budget_ops, 0u);
  EXPECT_EQ(r.drops, 0u);
  EXPECT_GT(r.d2h_bytes, 0u);
  EXPECT_LT(r.overhead_pct, 5.0);
  // Recomputing instead costs its 50 ms each iteration.
  const SimResult rc = replay(w, "recompute-only", o);
  EXPECT_GT(rc.overhead_pct, 10.0);
}

// A buffer that takes more memory than it holds (whole granules of a mapping) moves only what it
// holds: the copies take its copy_bytes' time and count those bytes, the budget counts the rest.
TEST(Simulator, ACopyMovesTheBuffersOwnBytesNotTheMemoryItTakes) {
  for (const std::uint64_t held : {std::uint64_t{24} * kMiB, std::uint64_t{40} * kMiB, std::uint64_t{63} * kMiB}) {
    for (const double gbps : {1.0, 12.0}) {
      Workload full = swapWins();
      Workload rounded = swapWins();
      for (WorkloadBuffer& b : rounded.buffers) b.copy_bytes = b.bytes * held / (64 * kMiB);
      SimOptions o;
      o.h2d_gbps = o.d2h_gbps = gbps;
      o.budget_bytes = full.peakBytes() - 64 * kMiB;
      const SimResult a = replay(full, "swap-only", o);
      const SimResult b = replay(rounded, "swap-only", o);
      ASSERT_GT(a.swaps, 0u);
      EXPECT_EQ(b.peak_bytes, a.peak_bytes);  // the budget sees the same memory
      EXPECT_EQ(b.swaps, a.swaps);
      EXPECT_LT(b.d2h_bytes, a.d2h_bytes);
      EXPECT_EQ(b.d2h_bytes * (64 * kMiB), a.d2h_bytes * held) << held << " " << gbps;
    }
  }
}

// One buffer forced out and back in full view: the wait is both copies of what it holds.
TEST(Simulator, ASwapWaitsForTheBytesItCopies) {
  for (const std::uint64_t held : {std::uint64_t{1} * kMiB, std::uint64_t{16} * kMiB, std::uint64_t{64} * kMiB}) {
    WorkloadBuilder b;
    const BufferId a = b.op("make_a", 1'000'000, {}, {64 * kMiB}, {}, false)[0];
    const BufferId t = b.op("make_t", 1'000'000, {}, {64 * kMiB}, {}, false)[0];
    b.free(t);
    b.op("use_a", 1'000'000, {a});
    b.free(a);
    Workload w = b.take();
    w.buffers[a].copy_bytes = held;
    SimOptions o;
    o.h2d_gbps = o.d2h_gbps = 1.0;  // a byte a nanosecond
    o.iterations = 1;
    o.warmup = 0;
    o.budget_bytes = 64 * kMiB;
    const SimResult r = replay(w, "lru", o);
    EXPECT_EQ(r.over_budget_ops, 0u);
    EXPECT_EQ(r.d2h_bytes, held);
    EXPECT_EQ(r.h2d_bytes, held);
    EXPECT_EQ(r.stall_ns, 2 * static_cast<std::int64_t>(held)) << held;
  }
}

TEST(Simulator, RecomputeMustWin) {
  const Workload w = recomputeWins();
  SimOptions o;
  o.budget_bytes = 1100 * kMiB;  // a and t cannot both be resident
  const SimResult r = replay(w, "delta", o);
  EXPECT_EQ(r.over_budget_ops, 0u);
  EXPECT_GT(r.drops, 0u);
  EXPECT_EQ(r.d2h_bytes, 0u);
  const SimResult rs = replay(w, "swap-only", o);
  EXPECT_GT(rs.overhead_pct, 5 * r.overhead_pct);
}

TEST(Simulator, RecomputeKeepsFreedInputsAlive) {
  // b = f(a) is dropped while a is alive; the program then frees a before b is needed again:
  // a must be kept (a framework's recompute graph would hold it) for b's recompute.
  WorkloadBuilder wb;
  const BufferId in = wb.persistent("in", kMiB);
  const BufferId a = wb.op("make_a", 1'000'000, {in}, {256 * kMiB})[0];
  const BufferId b = wb.op("make_b", 1'000, {a}, {512 * kMiB})[0];
  const BufferId t = wb.op("temp", 1'000'000, {in}, {512 * kMiB})[0];
  wb.op("use_t", 1'000'000, {t});
  wb.free(t);
  wb.free(a);
  wb.op("use_b", 1'000'000, {b});
  wb.free(b);
  const Workload w = wb.take();
  SimOptions o;
  o.budget_bytes = 800 * kMiB;
  const SimResult r = replay(w, "recompute-only", o);
  EXPECT_EQ(r.used_while_evicted, 0u);
  EXPECT_GT(r.drops, 0u);
  EXPECT_GT(r.recompute_ns, 0);
  EXPECT_EQ(r.over_budget_ops, 0u);
}

TEST(Simulator, FreedInputEndsRecomputability) {
  // a is freed before b has to go: b cannot be recomputed any more, so recompute-only cannot
  // evict it and must run over budget (counted), never use it while gone.
  WorkloadBuilder wb;
  const BufferId in = wb.persistent("in", kMiB);
  const BufferId a = wb.op("make_a", 1'000'000, {in}, {256 * kMiB})[0];
  const BufferId b = wb.op("make_b", 1'000, {a}, {512 * kMiB})[0];
  wb.free(a);
  const BufferId t = wb.op("temp", 1'000'000, {in}, {512 * kMiB})[0];
  wb.op("use_t", 1'000'000, {t});
  wb.free(t);
  wb.op("use_b", 1'000'000, {b});
  wb.free(b);
  const Workload w = wb.take();
  SimOptions o;
  o.budget_bytes = 800 * kMiB;
  const SimResult r = replay(w, "recompute-only", o);
  EXPECT_EQ(r.used_while_evicted, 0u);
  EXPECT_EQ(r.drops, 0u);
  EXPECT_GT(r.over_budget_ops, 0u);
  EXPECT_EQ(replay(w, "delta", o).over_budget_ops, 0u);  // delta swaps it instead
}

TEST(Simulator, InPlaceWriteEndsRecomputability) {
  // b = f(a), then a is written in place: b can no longer be recomputed from a.
  WorkloadBuilder wb;
  const BufferId in = wb.persistent("in", kMiB);
  const BufferId a = wb.op("make_a", 1'000'000, {in}, {256 * kMiB})[0];
  const BufferId b = wb.op("make_b", 1'000, {a}, {256 * kMiB})[0];
  wb.op("mutate_a", 1'000, {a}, {}, {a});
  const BufferId t = wb.op("temp", 1'000'000, {in}, {256 * kMiB})[0];
  wb.op("use", 1'000'000, {t, b});
  wb.free(t);
  wb.free(b);
  wb.free(a);
  const Workload w = wb.take();
  SimOptions o;
  o.budget_bytes = 700 * kMiB;
  const SimResult r = replay(w, "recompute-only", o);
  EXPECT_EQ(r.used_while_evicted, 0u);
}

// b = f(a) has to go for t; later the program gives up b's recipe (WorkloadOp::unregisters,
// as delta-play does for a result it frees while another's recompute keeps it) and then t2
// needs the room again.
Workload unregisteredAfterADrop(bool unregister) {
  WorkloadBuilder wb;
  const BufferId in = wb.persistent("in", kMiB);
  const BufferId a = wb.op("make_a", 1'000'000, {in}, {256 * kMiB})[0];
  const BufferId b = wb.op("make_b", 3'000, {a}, {512 * kMiB})[0];
  const BufferId t = wb.op("temp", 1'000'000, {in}, {512 * kMiB})[0];
  wb.op("use_t", 1'000'000, {t});
  wb.free(t);
  wb.op("between", 1'000'000, {in});
  Workload w = wb.take();
  if (unregister) w.ops.back().unregisters.push_back(b);
  const auto t2 = static_cast<BufferId>(w.buffers.size());
  w.buffers.push_back({"temp2", 512 * kMiB, false, static_cast<std::int32_t>(w.ops.size()), 1'000'000});
  w.ops.push_back({"temp2", 1'000'000, {t2}, {in}, {}, {}});
  w.ops.push_back({"use_t2", 1'000'000, {}, {t2}, {}, {t2}});
  w.ops.push_back({"use_b", 1'000'000, {}, {b}, {}, {b, a}});
  return w;
}

TEST(Simulator, AnUnregisteredBufferIsRegeneratedIfDroppedAndCanOnlyBeSwappedAfter) {
  SimOptions o;
  o.budget_bytes = 800 * kMiB;  // a and b leave no room for t or t2
  o.iterations = 1;
  o.warmup = 0;
  const SimResult kept = replay(unregisteredAfterADrop(false), "recompute-only", o);
  EXPECT_EQ(kept.over_budget_ops, 0u);  // b is dropped again for t2
  EXPECT_EQ(kept.used_while_evicted, 0u);
  const SimResult given_up = replay(unregisteredAfterADrop(true), "recompute-only", o);
  EXPECT_EQ(given_up.used_while_evicted, 0u);
  // b came back once in both, for use_b when kept recomputable, where its recipe went when
  // not: then it was resident for t2, and recompute-only could not drop it again.
  EXPECT_EQ(kept.recompute_ns, 3'000);
  EXPECT_EQ(given_up.recompute_ns, 3'000);
  EXPECT_GT(given_up.over_budget_ops, 0u);
  // delta swaps it instead, within the budget.
  const SimResult swapped = replay(unregisteredAfterADrop(true), "delta", o);
  EXPECT_EQ(swapped.over_budget_ops, 0u);
  EXPECT_EQ(swapped.used_while_evicted, 0u);
  EXPECT_GT(swapped.d2h_bytes, 0u);
}

TEST(Simulator, ALaunchNamesEachBufferOnce) {
  // An optimiser's update reads and writes its state: the shim names each buffer of a launch
  // once, and so does the replay, to the policy (what it learns) and in Workload::schedule.
  // Named twice, a swapped one counted its restore twice in the room made ahead.
  WorkloadBuilder wb;
  const BufferId weight = wb.persistent("weight", 64 * kMiB);
  const BufferId state = wb.persistent("state", 64 * kMiB);
  const BufferId grad = wb.op("backward", 1'000'000, {weight}, {64 * kMiB})[0];
  wb.op("step", 1'000'000, {weight, state, grad}, {}, {weight, state});
  wb.free(grad);
  const Workload w = wb.take();
  EXPECT_EQ(w.ops[1].workingSet(), (std::vector<BufferId>{weight, state, grad}));
  const UseSchedule s = w.schedule();
  EXPECT_EQ(s.buffersAt(1).size(), 3u);
  SimOptions o;
  o.budget_bytes = 160 * kMiB;
  o.iterations = 2;
  PolicyConfig config;
  config.max_buffers = static_cast<std::uint32_t>(w.buffers.size());
  config.max_launches = 64;
  config.max_uses = 256;
  DeltaPolicy delta(config, DirectorMode::kMixed);
  Simulator(w, o).run(delta);
  const UseSchedule& learned = delta.pattern().schedule();
  ASSERT_TRUE(learned.ready());
  ASSERT_EQ(learned.length(), 2u);
  EXPECT_EQ(learned.buffersAt(1).size(), 3u);
}

// Records when each launch started, as the simulator told it.
class StartSpy : public DeltaPolicy {
 public:
  using DeltaPolicy::DeltaPolicy;
  void onLaunch(const Launch& launch) override {
    starts.push_back(launch.now_ns);
    DeltaPolicy::onLaunch(launch);
  }
  std::vector<std::int64_t> starts;
};

// Records the free memory each prefetch request told.
class PrefetchSpy : public DeltaPolicy {
 public:
  using DeltaPolicy::DeltaPolicy;
  std::size_t choosePrefetches(const PrefetchRequest& request, std::span<Prefetch> out) override {
    told.push_back(request.free_bytes);
    return DeltaPolicy::choosePrefetches(request, out);
  }
  std::vector<std::uint64_t> told;
};

// Prefetches are told the budget less what is resident and in flight (Prefetcher::choose holds a
// restore back behind a backlog by it), or nothing, as the shim runs them
// (SimOptions::prefetch_sees_free_memory, which the replay as played turns off).
TEST(Simulator, PrefetchesAreToldTheFreeMemoryUnlessAsTheShimRunsThem) {
  for (int layers : {4, 9}) {
    for (double share : {0.35, 0.6}) {
      SCOPED_TRACE(::testing::Message() << layers << " layers, " << share << " of peak");
      const Workload w = trainingWorkload(layers, 64 * kMiB, 1'000'000);
      SimOptions o;
      o.budget_bytes = static_cast<std::uint64_t>(share * static_cast<double>(w.peakBytes()));
      PrefetchSpy told(policyConfigFor(w, o), DirectorMode::kSwapOnly);
      Simulator(w, o).run(told);
      ASSERT_FALSE(told.told.empty());
      bool short_of_budget = false;
      for (std::uint64_t free : told.told) {
        ASSERT_LE(free, o.budget_bytes);
        short_of_budget = short_of_budget || free < o.budget_bytes;
      }
      EXPECT_TRUE(short_of_budget);
      o.prefetch_sees_free_memory = false;
      PrefetchSpy untold(policyConfigFor(w, o), DirectorMode::kSwapOnly);
      Simulator(w, o).run(untold);
      ASSERT_FALSE(untold.told.empty());
      for (std::uint64_t free : untold.told) EXPECT_EQ(free, kUnknownBytes);
    }
  }
}

TEST(Simulator, DeltaLearnsTheIterationAsTheRunTimedItThroughTheShimsCode) {
  // The shim times what delta learns by the device's reports (onLaunchTimed); the replay
  // reports each launch's run as the device would, so that the policy it replays is the one the
  // shim runs. Timed as run: each launch where it started, after its waits, in the last
  // iteration reported whole (the one before the last: the last has no boundary after it).
  bool waited = false;
  for (int layers : {4, 9}) {
    for (double share : {0.35, 0.6, 1.0}) {
      for (double gbps : {2.0, 12.0}) {
        SCOPED_TRACE(::testing::Message() << layers << " layers, " << share << " of peak, " << gbps << " GB/s");
        const Workload w = trainingWorkload(layers, 64 * kMiB, 1'000'000 + 137'000 * layers);
        SimOptions o;
        o.budget_bytes = static_cast<std::uint64_t>(share * static_cast<double>(w.peakBytes()));
        o.h2d_gbps = o.d2h_gbps = gbps;
        o.iterations = 4;
        const PolicyConfig config = policyConfigFor(w, o);
        ASSERT_TRUE(config.timed_launches);
        StartSpy delta(config, DirectorMode::kMixed);
        Simulator(w, o).run(delta);
        const UseSchedule& learned = delta.pattern().schedule();
        const std::size_t len = w.ops.size();
        ASSERT_TRUE(learned.ready());
        ASSERT_EQ(learned.length(), len);
        ASSERT_EQ(delta.starts.size(), 4 * len);
        EXPECT_GE(delta.pattern().deviceTimed(), 1u);
        const std::int64_t origin = delta.starts[2 * len];
        for (std::size_t pos = 0; pos < len; ++pos)
          EXPECT_EQ(learned.offsetNs(static_cast<std::uint32_t>(pos)), delta.starts[2 * len + pos] - origin) << pos;
        // Through the end of its last launch.
        EXPECT_EQ(learned.durationNs(), delta.starts[3 * len - 1] + w.ops.back().compute_ns - origin);
        waited = waited || learned.durationNs() > w.computeNs();
      }
    }
  }
  EXPECT_TRUE(waited);  // some rows waited: timed by compute alone, they would not match
}

// Every figure of a run, as one value to compare.
auto figures(const SimResult& r) {
  return std::tuple(r.total_ns, r.run_ns, r.last_iteration_ns, r.compute_ns, r.recompute_ns, r.peak_bytes,
                    r.h2d_bytes, r.d2h_bytes, r.swaps, r.drops, r.prefetches, r.over_budget_ops, r.gave_up);
}

// The planner learns the iteration once per mode and runs each candidate on from a copy of that
// run (Planner::choose): a copied simulator resumed with a copy of delta must run exactly as the
// whole run would have, whatever the copy is told before it goes on (here: the mode and window
// it switches to once it has learned the iteration), and whatever the run copied from does
// next. Stopped before the iteration is learned (0 or 1 iterations run) the switch is still to
// come; stopped after, the copy goes on unswitched.
TEST(Simulator, ACopyResumedRunsAsTheWholeRunWould) {
  const std::pair<DirectorMode, Prefetcher::Window> switches[] = {
      {DirectorMode::kMixed, Prefetcher::Window::kGross},
      {DirectorMode::kSwapOnly, Prefetcher::Window::kNet},
      {DirectorMode::kRecomputeOnly, Prefetcher::Window::kNone},
      {DirectorMode::kMixed, Prefetcher::Window::kFar}};
  std::uint64_t evicted = 0;
  for (std::uint32_t seed = 1; seed <= 4; ++seed) {
    std::mt19937 rng(seed);
    const Workload shapes[] = {testing::randomTraining(rng, 3 + static_cast<int>(seed)),
                               testing::randomGraph(rng, 12 + 2 * static_cast<int>(seed))};
    for (const Workload& w : shapes) {
      for (double share : {0.5, 0.8}) {
        for (double gbps : {12.0, 50.0}) {
          SimOptions o;
          o.budget_bytes = static_cast<std::uint64_t>(share * static_cast<double>(w.peakBytes()));
          o.h2d_gbps = o.d2h_gbps = gbps;
          o.iterations = 4;
          const PolicyConfig config = policyConfigFor(w, o);
          for (std::uint32_t stop = 0; stop <= 2; ++stop) {
            for (std::size_t k = 0; k < std::size(switches); ++k) {
              const bool switched = stop <= 1;
              SCOPED_TRACE(::testing::Message() << "seed " << seed << ", " << w.ops.size() << " ops, " << share
                                                << " of peak, " << gbps << " GB/s, stopped after " << stop
                                                << ", switch " << k);
              DeltaPolicy whole_policy(config, DirectorMode::kMixed);
              if (switched) whole_policy.switchWhenLearned(switches[k].first, switches[k].second);
              const SimResult whole = Simulator(w, o).run(whole_policy);

              Simulator stopped(w, o);
              DeltaPolicy stopped_policy(config, DirectorMode::kMixed);
              stopped.runFirst(stopped_policy, stop);
              Simulator copy = stopped;
              DeltaPolicy copy_policy = stopped_policy;
              if (switched) copy_policy.switchWhenLearned(switches[k].first, switches[k].second);
              // The one copied from goes on first, its own way (unswitched): a copy that still
              // shared any of its state would see it change.
              const SimResult original = stopped.resume(stopped_policy);
              if (!switched) {
                EXPECT_EQ(figures(original), figures(whole));
              }
              EXPECT_EQ(figures(copy.resume(copy_policy)), figures(whole));
              evicted += whole.swaps + whole.drops;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(evicted, 0u);  // the runs compared made decisions
}

TEST(Simulator, TheWaitsByBufferAddUpToTheMeasuredIterationsWaits) {
  // Every wait of an op beyond its predecessor's end goes to one buffer, so over the measured
  // iterations the buffers' waits are the time beyond the compute: stalls and recomputes. Those
  // of the warm-up are left out, and a copy of the simulator goes on with its own sums.
  int waited_rows = 0;
  for (std::uint32_t seed = 1; seed <= 4; ++seed) {
    std::mt19937 rng(seed);
    const Workload shapes[] = {testing::randomTraining(rng, 3 + static_cast<int>(seed)),
                               testing::randomGraph(rng, 12 + 2 * static_cast<int>(seed))};
    for (const Workload& w : shapes) {
      for (const char* name : {"delta", "lru", "recompute-only"}) {
        for (double gbps : {1.0, 50.0}) {
          SimOptions o;
          o.budget_bytes = w.peakBytes() / 2;
          o.h2d_gbps = o.d2h_gbps = gbps;
          o.iterations = 4;
          o.warmup = 2;
          SCOPED_TRACE(::testing::Message() << "seed " << seed << ", " << w.ops.size() << " ops, " << name << ", "
                                            << gbps << " GB/s");
          PolicyResult p = makePolicy(name, policyConfigFor(w, o));
          ASSERT_NE(p.policy, nullptr);
          Simulator sim(w, o);
          sim.recordWaitsByBuffer();
          sim.runFirst(*p.policy, 1);
          Simulator copy = sim;
          const SimResult r = sim.resume(*p.policy);
          std::int64_t sum = 0;
          for (std::int64_t ns : sim.waitedByBuffer()) sum += ns;
          EXPECT_EQ(sum, r.total_ns - r.compute_ns);
          if (sum > 0) ++waited_rows;
          std::int64_t copied = 0;
          for (std::int64_t ns : copy.waitedByBuffer()) copied += ns;
          EXPECT_EQ(copied, 0);  // nothing measured before it was made, and nothing since
        }
      }
    }
  }
  EXPECT_GT(waited_rows, 10);
}

TEST(Workload, ValidateFindsAnUnregisterOfWhatIsNotAllocated) {
  WorkloadBuilder wb;
  const BufferId a = wb.op("make", 1, {}, {8})[0];
  wb.free(a);
  wb.op("later", 1, {});
  Workload w = wb.take();
  w.ops.back().unregisters.push_back(a);
  EXPECT_NE(w.validate().find("used while not allocated"), std::string::npos);
}

TEST(Workload, ScaledGrowsActivationsAndTime) {
  const Workload w = trainingWorkload(4, 64 * kMiB, 1'000'000, kMiB);
  const Workload s = w.scaled(2.0);
  EXPECT_EQ(s.computeNs(), 2 * w.computeNs());
  EXPECT_EQ(s.buffers[0].bytes, kMiB);  // weights do not grow
  std::uint64_t persistent = 0;
  for (const auto& b : w.buffers) persistent += b.persistent ? b.bytes : 0;
  EXPECT_EQ(s.peakBytes() - persistent, 2 * (w.peakBytes() - persistent));
}

TEST(Workload, ValidateFindsUseAfterFree) {
  WorkloadBuilder wb;
  const BufferId a = wb.op("make", 1, {}, {8})[0];
  wb.free(a);
  wb.op("use", 1, {a});
  EXPECT_NE(wb.take().validate().find("used while not allocated"), std::string::npos);
}

}  // namespace
}  // namespace delta::policy
