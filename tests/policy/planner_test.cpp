// Delta's planner: the learned iteration rebuilt as a workload, and the choice of a mode and of
// the window that makes room ahead, by replaying it.
#include "policy/planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "policy/delta_policy.h"
#include "policy/policy_factory.h"
#include "policy/simulator.h"
#include "workload_builder.h"

namespace delta::policy {
namespace {

using testing::trainingWorkload;
using testing::WorkloadBuilder;

constexpr std::uint64_t kMiB = 1u << 20;

// What delta would have recorded for `w`'s buffers (ids are the workload's).
std::vector<PlannedBuffer> plannedFor(const Workload& w) {
  std::vector<PlannedBuffer> p(w.buffers.size());
  for (std::size_t i = 0; i < w.buffers.size(); ++i) {
    p[i].bytes = w.buffers[i].bytes;
    p[i].recompute_ns = w.buffers[i].producer >= 0 ? w.buffers[i].recompute_ns : kUnknownNs;
  }
  return p;
}

PolicyConfig configFor(const Workload& w, std::uint64_t budget, double gbps) {
  PolicyConfig config;
  config.max_buffers = static_cast<std::uint32_t>(w.buffers.size());
  config.max_launches = 4096;
  config.max_uses = 1 << 16;
  config.h2d_gbps = config.d2h_gbps = gbps;
  config.budget_bytes = budget;
  return config;
}

SimResult replay(const Workload& w, std::string_view name, std::uint64_t budget, double gbps,
                 std::uint64_t planning_budget, SimOptions o = {}) {
  o.budget_bytes = budget;
  o.h2d_gbps = o.d2h_gbps = gbps;
  PolicyConfig config = configFor(w, planning_budget, gbps);
  config.plan_elsewhere = o.plan_elsewhere;
  PolicyResult p = makePolicy(name, config);
  EXPECT_EQ(p.error, "");
  Simulator sim(w, o);
  return sim.run(*p.policy);
}

TEST(PlannerWorkload, RoundTripReplaysLikeTheOriginal) {
  // Every launch of a training iteration, with its allocations, frees and recompute costs,
  // comes back as the same ops: the same compute, the same peak, the same replay to the ns.
  // The input is used before the weights made ahead of it (and, in the random ones, weights
  // of different sizes): ties between candidates go to the lower id, so the rebuilt buffers
  // must keep the policy's order of the persistent ones.
  std::vector<Workload> workloads;
  workloads.push_back(trainingWorkload(6, 64 * kMiB, 1'000'000));
  for (std::uint32_t seed = 1; seed <= 4; ++seed) {
    std::mt19937 rng(seed);
    workloads.push_back(testing::randomTraining(rng, 4 + static_cast<int>(seed) * 2));
  }
  for (const Workload& w : workloads) {
    const Workload rebuilt = Planner::workloadFrom(w.schedule(), plannedFor(w), {});
    ASSERT_EQ(rebuilt.validate(), "");
    EXPECT_EQ(rebuilt.ops.size(), w.ops.size());
    EXPECT_EQ(rebuilt.computeNs(), w.computeNs());
    EXPECT_EQ(rebuilt.peakBytes(), w.peakBytes());
    for (std::string_view policy : {"lru", "dtr", "swap-only", "recompute-only", "delta"}) {
      for (double share : {0.3, 0.5, 0.7}) {
        const auto budget = static_cast<std::uint64_t>(share * static_cast<double>(w.peakBytes()));
        const SimResult a = replay(w, policy, budget, 12.0, 0);
        const SimResult b = replay(rebuilt, policy, budget, 12.0, 0);
        EXPECT_EQ(a.total_ns, b.total_ns) << policy << " " << share << " " << w.ops.size() << " ops";
        EXPECT_EQ(a.over_budget_ops, b.over_budget_ops) << policy;
      }
    }
  }
}

TEST(PlannerWorkload, PersistentBuffersComeFirstInTheirIdOrder) {
  // Weights made before the input but used after it, and in reverse: the rebuilt workload
  // makes them in the policy's order (ids), ahead of everything the iteration allocates.
  WorkloadBuilder b;
  const BufferId w0 = b.persistent("w0", 1 * kMiB);
  const BufferId w1 = b.persistent("w1", 2 * kMiB);
  const BufferId input = b.persistent("input", 3 * kMiB);
  const BufferId a = b.op("a", 1'000, {input}, {4 * kMiB})[0];
  const BufferId c = b.op("b", 1'000, {a, w1}, {5 * kMiB})[0];
  b.free(a);
  b.op("c", 1'000, {c, w0});
  b.free(c);
  const Workload w = b.take();
  const Workload rebuilt = Planner::workloadFrom(w.schedule(), plannedFor(w), {});
  ASSERT_EQ(rebuilt.validate(), "");
  ASSERT_EQ(rebuilt.buffers.size(), 5u);
  for (BufferId id : {w0, w1, input}) {
    EXPECT_TRUE(rebuilt.buffers[id].persistent) << id;
    EXPECT_EQ(rebuilt.buffers[id].bytes, w.buffers[id].bytes) << id;
  }
  EXPECT_EQ(rebuilt.ops[0].reads, std::vector<BufferId>{input});
  EXPECT_EQ(rebuilt.buffers[rebuilt.ops[0].allocs.at(0)].bytes, 4 * kMiB);
  EXPECT_EQ(rebuilt.buffers[rebuilt.ops[1].allocs.at(0)].bytes, 5 * kMiB);
}

TEST(PlannerWorkload, ComputeIsTheIntervalLessTheNextLaunchesWait) {
  WorkloadBuilder b;
  const BufferId in = b.persistent("in", kMiB);
  const BufferId x = b.op("a", 10'000, {in}, {kMiB})[0];
  b.op("b", 20'000, {x});
  b.free(x);
  b.op("c", 30'000, {in});
  const Workload w = b.take();
  const std::vector<std::int64_t> waited = {0, 4'000, 50'000};  // launch 2 waited longer than b ran
  const Workload rebuilt = Planner::workloadFrom(w.schedule(), plannedFor(w), waited);
  ASSERT_EQ(rebuilt.ops.size(), 3u);
  EXPECT_EQ(rebuilt.ops[0].compute_ns, 6'000);
  EXPECT_EQ(rebuilt.ops[1].compute_ns, 0);  // never negative
  EXPECT_EQ(rebuilt.ops[2].compute_ns, 30'000);
}

TEST(PlannerWorkload, BuffersAllocatedAtFirstUseFreedWhereFreedPersistentOtherwise) {
  WorkloadBuilder b;
  const BufferId weight = b.persistent("weight", 4 * kMiB);
  const BufferId act = b.op("fwd", 1'000, {weight}, {2 * kMiB})[0];
  b.op("bwd", 2'000, {act, weight});
  b.free(act);
  const Workload w = b.take();
  const Workload rebuilt = Planner::workloadFrom(w.schedule(), plannedFor(w), {});
  ASSERT_EQ(rebuilt.validate(), "");
  ASSERT_EQ(rebuilt.buffers.size(), 2u);
  // fwd touches weight first (its read), then act (its result): rebuilt in that order.
  const WorkloadBuffer& rw = rebuilt.buffers[rebuilt.ops[0].reads.at(0)];
  EXPECT_TRUE(rw.persistent);
  EXPECT_EQ(rw.bytes, 4 * kMiB);
  ASSERT_EQ(rebuilt.ops[0].allocs.size(), 1u);
  const BufferId ra = rebuilt.ops[0].allocs[0];
  EXPECT_FALSE(rebuilt.buffers[ra].persistent);
  EXPECT_EQ(rebuilt.buffers[ra].producer, 0);
  EXPECT_EQ(rebuilt.buffers[ra].recompute_ns, 1'000);
  EXPECT_EQ(rebuilt.ops[1].frees, std::vector<BufferId>{ra});
}

TEST(PlannerWorkload, LostRecomputabilityIsReplayedAsAWrite) {
  WorkloadBuilder b;
  const BufferId in = b.persistent("in", kMiB);
  const BufferId x = b.op("make", 1'000, {in}, {kMiB})[0];
  b.op("update", 1'000, {in}, {}, {x});  // written in place: no longer recomputable after it
  b.op("use", 1'000, {x});
  b.free(x);
  const Workload w = b.take();
  std::vector<PlannedBuffer> planned = plannedFor(w);
  planned[x].lost_at = 1;
  const Workload rebuilt = Planner::workloadFrom(w.schedule(), planned, {});
  ASSERT_EQ(rebuilt.validate(), "");
  const BufferId rx = rebuilt.ops[0].allocs.at(0);
  EXPECT_EQ(rebuilt.ops[1].writes, std::vector<BufferId>{rx});
  EXPECT_EQ(std::count(rebuilt.ops[2].reads.begin(), rebuilt.ops[2].reads.end(), rx), 1);
}

TEST(PlannerWorkload, AnIdUsedAgainAfterItsFreeIsANewBufferFreedAtTheEnd) {
  // The shim reuses ids: a slot freed after launch 1 and allocated again at launch 2.
  UseSchedule s;
  s.reserve(4, 8, 32);
  const BufferId a = 0;
  const BufferId ids0[] = {a};
  s.addLaunch(0, kMiB, ids0);
  s.addLaunch(1'000, 0, ids0);
  s.addFree(a, kMiB);
  s.addLaunch(2'000, kMiB, ids0);
  s.finish(3'000);
  std::vector<PlannedBuffer> planned(4);
  planned[a].bytes = kMiB;
  const Workload rebuilt = Planner::workloadFrom(s, planned, {});
  ASSERT_EQ(rebuilt.validate(), "");
  ASSERT_EQ(rebuilt.buffers.size(), 2u);
  EXPECT_EQ(rebuilt.ops[0].allocs.size(), 1u);
  EXPECT_EQ(rebuilt.ops[1].frees.size(), 1u);
  EXPECT_EQ(rebuilt.ops[2].allocs.size(), 1u);
  EXPECT_EQ(rebuilt.ops[2].frees.size(), 1u);
  EXPECT_NE(rebuilt.ops[0].allocs[0], rebuilt.ops[2].allocs[0]);
}

TEST(PlannerChoose, NoBudgetNoIterationOrNoPressureNoPlan) {
  const Workload w = trainingWorkload(4, 64 * kMiB, 1'000'000);
  const CostModel costs(12.0, 12.0);
  EXPECT_FALSE(Planner::choose(w, 0, costs).planned);
  EXPECT_FALSE(Planner::choose(Workload{}, w.peakBytes() / 2, costs).planned);
  EXPECT_FALSE(Planner::choose(w, w.peakBytes(), costs).planned);  // it fits: nothing to plan
}

TEST(PlannerChoose, KeepsTheFastestCandidateAndIsDeterministic) {
  const Workload w = trainingWorkload(8, 64 * kMiB, 1'000'000);
  for (double gbps : {1.0, 12.0, 50.0}) {
    for (double share : {0.3, 0.5, 0.7}) {
      const std::uint64_t budget = static_cast<std::uint64_t>(share * static_cast<double>(w.peakBytes()));
      const Plan p = Planner::choose(w, budget, CostModel(gbps, gbps));
      const std::string where = std::to_string(share) + " of peak at " + std::to_string(gbps) + " GB/s";
      ASSERT_TRUE(p.planned) << where;
      const int cs = static_cast<int>(p.start), cm = static_cast<int>(p.mode), cw = static_cast<int>(p.window);
      EXPECT_TRUE(p.checked[cs][cm][cw]) << where;
      for (int s = 0; s < 2; ++s) {
        for (int m = 0; m < 3; ++m) {
          for (int win = 0; win < Prefetcher::kWindows; ++win) {
            // Every candidate but a fresh start in the configured mode (the switched one), no
            // room made ahead only for recompute-only, the far window only for the others.
            const bool recompute_only = m == static_cast<int>(DirectorMode::kRecomputeOnly);
            if ((s == 1 && m == 0) || (win == static_cast<int>(Prefetcher::Window::kNone) && !recompute_only) ||
                (win == static_cast<int>(Prefetcher::Window::kFar) && recompute_only)) {
              EXPECT_EQ(p.predicted_ns[s][m][win], Plan::kNotReplayed) << where;
              continue;
            }
            if (p.predicted_ns[s][m][win] == Plan::kGaveUp) continue;  // far slower than another
            EXPECT_GT(p.predicted_ns[s][m][win], 0) << where;
            EXPECT_GE(p.ranked_ns[s][m][win], p.predicted_ns[s][m][win]) << where;  // two iterations
            // Fewer ops over the budget first, then the shorter time over the two iterations
            // after learning, as checked (replayed again as the run adopting it goes). One
            // faster and not chosen was not checked (its check cut short as slower), or the
            // chosen one is faster with its vetoes (the veto search from another mode's best).
            EXPECT_LE(p.over_budget_ops[cs][cm][cw], p.over_budget_ops[s][m][win]) << where;
            if (p.over_budget_ops[cs][cm][cw] == p.over_budget_ops[s][m][win] &&
                p.ranked_ns[s][m][win] < p.ranked_ns[cs][cm][cw] && p.checked[s][m][win]) {
              EXPECT_FALSE(p.vetoed.empty()) << where;
              EXPECT_LT(p.vetoed_ranked_ns, p.ranked_ns[s][m][win]) << where;
            }
          }
        }
      }
      // The chosen replay's times come with its device's waits, one per launch, for delta to
      // time its restores by as the replay did.
      if (!p.learned_offsets_ns.empty()) {
        EXPECT_EQ(p.learned_waits_ns.size() + 1, p.learned_offsets_ns.size()) << where;
      }
      const Plan again = Planner::choose(w, budget, CostModel(gbps, gbps));
      EXPECT_EQ(again.mode, p.mode) << where;
      EXPECT_EQ(again.window, p.window) << where;
      EXPECT_EQ(again.start, p.start) << where;
      EXPECT_EQ(again.chosenNs(), p.chosenNs()) << where;
    }
  }
}

TEST(PlannerChoose, CutsShortOnlyAReplayFarSlowerThanTheShortest) {
  // Activations of 256 MiB made in 0.1 ms on a 1 GB/s link: swapping them takes hundreds of
  // times the compute. The swap-only replays are cut short, and rightly: run in full, they take
  // over Planner::kGiveUpFactor times the chosen candidate's run.
  const Workload w = trainingWorkload(8, 256 * kMiB, 100'000);
  const std::uint64_t budget = w.peakBytes() / 2;
  const Plan p = Planner::choose(w, budget, CostModel(1.0, 1.0));
  ASSERT_TRUE(p.planned);
  const auto& switched = p.predicted_ns[static_cast<int>(PlanStart::kSwitched)];
  EXPECT_EQ(switched[static_cast<int>(DirectorMode::kSwapOnly)][0], Plan::kGaveUp);
  EXPECT_EQ(switched[static_cast<int>(DirectorMode::kSwapOnly)][1], Plan::kGaveUp);
  EXPECT_GT(switched[static_cast<int>(DirectorMode::kMixed)][0], 0);
  EXPECT_NE(p.mode, DirectorMode::kSwapOnly);
  SimOptions o;
  o.budget_bytes = budget;
  o.h2d_gbps = o.d2h_gbps = 1.0;
  o.iterations = 3;
  o.warmup = 2;
  PolicyConfig config = policyConfigFor(w, o);
  config.budget_bytes = 0;
  auto full_run = [&](DirectorMode mode, Prefetcher::Window window, PlanStart start) {
    DeltaPolicy policy(config, start == PlanStart::kFresh ? mode : DirectorMode::kMixed);
    policy.switchWhenLearned(mode, window);
    return Simulator(w, o).run(policy).run_ns;
  };
  EXPECT_GT(full_run(DirectorMode::kSwapOnly, Prefetcher::Window::kGross, PlanStart::kSwitched),
            Planner::kGiveUpFactor * full_run(p.mode, p.window, p.start));
}

// Mixed's prior for a swap context not measured yet (Plan::optimistic): both are replayed with
// the gross window, and the faster, ranked as candidates are, is every mixed candidate's. Each
// shape is replayed here under both priors, outside the planner: the planner's figures are
// those replays, and it kept the faster. Where drops cost about as much as swaps would show
// on the link, pessimism drops what a swap would have hidden, and the optimistic prior must win.
TEST(PlannerChoose, MixedRunsUnderTheFasterPriorForSwapsNotMeasuredYet) {
  struct Shape {
    std::string name;
    Workload w;
    double gbps;
    double share;
    bool optimistic_wins;  // by a margin: swaps hide that pessimism never tries
  };
  std::vector<Shape> shapes;
  shapes.push_back({"8 x 64 MiB, 3 ms per layer", trainingWorkload(8, 64 * kMiB, 3'000'000), 12.0, 0.7, true});
  shapes.push_back({"8 x 64 MiB, 1 ms per layer", trainingWorkload(8, 64 * kMiB, 1'000'000), 12.0, 0.3, true});
  shapes.push_back({"16 x 16 MiB, 0.2 ms per layer", trainingWorkload(16, 16 * kMiB, 200'000), 12.0, 0.3, false});
  std::mt19937 rng(7);
  for (int i = 0; i < 4; ++i) {
    const double gbps = i % 2 ? 50.0 : 12.0;
    shapes.push_back({"random " + std::to_string(i), testing::randomTraining(rng, 12), gbps, 0.5, false});
  }
  int optimistic = 0, pessimistic = 0;
  for (const Shape& c : shapes) {
    const std::uint64_t budget = static_cast<std::uint64_t>(c.share * static_cast<double>(c.w.peakBytes()));
    const Plan p = Planner::choose(c.w, budget, CostModel(c.gbps, c.gbps));
    ASSERT_TRUE(p.planned) << c.name;
    SimOptions o;
    o.budget_bytes = budget;
    o.h2d_gbps = o.d2h_gbps = c.gbps;
    o.iterations = 3;
    o.warmup = 1;
    PolicyConfig config = policyConfigFor(c.w, o);
    config.budget_bytes = 0;
    auto mixed_under = [&](bool prior) {
      DeltaPolicy policy(config, DirectorMode::kMixed);
      policy.switchWhenLearned(DirectorMode::kMixed, Prefetcher::Window::kGross, prior);
      const SimResult r = Simulator(c.w, o).run(policy);
      EXPECT_EQ(policy.untriedSwapShare(), prior ? 0.0 : 1.0) << c.name;
      return r;
    };
    const SimResult chosen = mixed_under(p.optimistic);
    const SimResult other = mixed_under(!p.optimistic);
    // Checked (replayed again as a run adopting it goes), its figures are the check's.
    if (!p.checked[0][0][0]) {
      EXPECT_EQ(p.predicted_ns[0][0][0], chosen.last_iteration_ns) << c.name;
      EXPECT_EQ(p.ranked_ns[0][0][0], chosen.total_ns) << c.name;
    }
    EXPECT_EQ(p.other_prior_ns, other.last_iteration_ns) << c.name;
    EXPECT_LE(chosen.over_budget_ops, other.over_budget_ops) << c.name;
    if (chosen.over_budget_ops == other.over_budget_ops) {
      EXPECT_LE(chosen.total_ns, other.total_ns) << c.name;
      // Pessimism keeps a tie of the whole replay too: the way delta ran before the prior was a
      // choice.
      if (p.optimistic && chosen.total_ns == other.total_ns) {
        EXPECT_LT(chosen.run_ns, other.run_ns) << c.name;
      }
    }
    if (c.optimistic_wins) {
      EXPECT_TRUE(p.optimistic) << c.name << ": " << p.predictions();
      EXPECT_LT(chosen.last_iteration_ns * 20, other.last_iteration_ns * 19) << c.name << ": " << p.predictions();
    }
    (p.optimistic ? optimistic : pessimistic) += 1;
    // The names say which prior the mixed candidates ran with; a mode that is not mixed runs
    // with none.
    const bool named = p.name().find("/optimistic") != std::string::npos;
    EXPECT_EQ(named, p.optimistic && p.mode == DirectorMode::kMixed) << c.name << ": " << p.name();
    EXPECT_NE(p.predictions().find("mixed/optimistic "), std::string::npos) << c.name;
  }
  // Both priors win somewhere among these shapes: neither is a constant answer.
  EXPECT_GT(optimistic, 0);
  EXPECT_GT(pessimistic, 0);
}

// An iteration that starts by reading 256 MiB of state, then `quiet` launches 2 ms apart that
// each make and free 1 MiB, then one that reads 64 MiB of weights and makes `burst` bytes.
Workload stateThenBurst(int quiet, std::uint64_t burst) {
  WorkloadBuilder b;
  const BufferId state = b.persistent("state", 256 * kMiB);
  const BufferId weights = b.persistent("weights", 64 * kMiB);
  const BufferId small = b.persistent("small", kMiB);
  b.op("read state", 1'000'000, {state});
  for (int i = 0; i < quiet; ++i) {
    const BufferId a = b.op("quiet" + std::to_string(i), 2'000'000, {small}, {kMiB})[0];
    b.free(a);
  }
  const BufferId out = b.op("burst", 1'000'000, {weights}, {burst})[0];
  b.free(out);
  return b.take();
}

// A replay that leaves the budget runs fast by not evicting; measured against it, every
// candidate that keeps the budget looked too slow and was cut short. Here the fresh
// recompute-only starts drop the burst's buffer and keep the state, over the budget, in
// 18 ms per iteration where the others take about 62.
TEST(PlannerChoose, AReplayOverTheBudgetCutsNoOtherShort) {
  for (int quiet : {8, 10}) {
    for (std::uint64_t burst : {192 * kMiB, 256 * kMiB}) {
      const Workload w = stateThenBurst(quiet, burst);
      const std::uint64_t budget = 256 * kMiB + 64 * kMiB + kMiB + burst / 2;  // the state must leave
      const std::string where = std::to_string(quiet) + " quiet launches, " + std::to_string(burst >> 20) + " MiB";
      const Plan p = Planner::choose(w, budget, CostModel(12.0, 12.0));
      ASSERT_TRUE(p.planned) << where;
      const int fresh = static_cast<int>(PlanStart::kFresh);
      const int recompute_only = static_cast<int>(DirectorMode::kRecomputeOnly);
      EXPECT_GT(p.over_budget_ops[fresh][recompute_only][0], 0u) << where;
      EXPECT_EQ(p.over_budget_ops[p.start == PlanStart::kFresh][static_cast<int>(p.mode)][static_cast<int>(p.window)], 0u)
          << where;
      for (const auto& by_start : p.predicted_ns) {
        for (const auto& by_mode : by_start) {
          for (std::int64_t ns : by_mode) EXPECT_NE(ns, Plan::kGaveUp) << where << ": " << p.predictions();
        }
      }
    }
  }
}

// Where one mode must lose: the planner must not choose it, and its replay must be slower by
// at least `margin` times the chosen candidate's.
struct MustLose {
  const char* name;
  std::uint64_t act_bytes;
  std::int64_t fwd_ns;
  double gbps;
  DirectorMode loser;
  std::int64_t margin;
};

class PlannerMustLose : public ::testing::TestWithParam<MustLose> {};

TEST_P(PlannerMustLose, IsNotChosen) {
  const MustLose& c = GetParam();
  const Workload w = trainingWorkload(8, c.act_bytes, c.fwd_ns);
  const Plan p = Planner::choose(w, w.peakBytes() / 2, CostModel(c.gbps, c.gbps));
  ASSERT_TRUE(p.planned);
  EXPECT_NE(p.mode, c.loser);
  int replayed = 0;
  for (const auto& by_start : p.predicted_ns) {
    for (std::int64_t loser : by_start[static_cast<int>(c.loser)]) {
      if (loser == Plan::kNotReplayed) continue;
      ++replayed;
      // Cut short: its run took over kGiveUpFactor times the shortest one.
      if (loser == Plan::kGaveUp) continue;
      EXPECT_GT(loser, c.margin * p.chosenNs());
    }
  }
  EXPECT_GT(replayed, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PlannerMustLose,
    ::testing::Values(
        // Activations of 256 MiB made in 0.1 ms: moving one takes ~270 ms at 1 GB/s.
        MustLose{"slow_link_cheap_recompute", 256 * kMiB, 100'000, 1.0, DirectorMode::kSwapOnly, 2},
        // 50 ms to make each 16 MiB activation: its transfer (~0.3 ms at 50 GB/s) hides.
        MustLose{"fast_link_costly_recompute", 16 * kMiB, 50'000'000, 50.0, DirectorMode::kRecomputeOnly, 1}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(DeltaPlanning, PlansOnceTheIterationIsLearnedAndOnlyWithABudget) {
  const Workload w = trainingWorkload(8, 256 * kMiB, 100'000);
  SimOptions o;
  o.budget_bytes = w.peakBytes() / 2;
  o.h2d_gbps = o.d2h_gbps = 1.0;
  DeltaPolicy planned(configFor(w, o.budget_bytes, 1.0), DirectorMode::kMixed);
  EXPECT_FALSE(planned.plan().planned);
  EXPECT_EQ(planned.activeMode(), DirectorMode::kMixed);
  const SimResult r = Simulator(w, o).run(planned);
  EXPECT_TRUE(planned.plan().planned);
  EXPECT_EQ(planned.activeMode(), planned.plan().mode);
  EXPECT_NE(planned.activeMode(), DirectorMode::kSwapOnly);
  EXPECT_EQ(r.over_budget_ops, 0u);
  EXPECT_EQ(r.used_while_evicted, 0u);

  DeltaPolicy unplanned(configFor(w, 0, 1.0), DirectorMode::kMixed);
  Simulator(w, o).run(unplanned);
  EXPECT_FALSE(unplanned.plan().planned);
  // The forced variants plan only the window: their mode is what was asked for.
  DeltaPolicy swap_only(configFor(w, o.budget_bytes, 1.0), DirectorMode::kSwapOnly);
  Simulator(w, o).run(swap_only);
  EXPECT_TRUE(swap_only.plan().planned);
  EXPECT_EQ(swap_only.activeMode(), DirectorMode::kSwapOnly);
  const auto& switched = swap_only.plan().predicted_ns[static_cast<int>(PlanStart::kSwitched)];
  EXPECT_EQ(switched[static_cast<int>(DirectorMode::kMixed)][0], Plan::kNotReplayed);
  EXPECT_GT(switched[static_cast<int>(DirectorMode::kSwapOnly)][1], 0);
  // Copies out need room made ahead: a swapping mode never plans without.
  EXPECT_EQ(switched[static_cast<int>(DirectorMode::kSwapOnly)][static_cast<int>(Prefetcher::Window::kNone)],
            Plan::kNotReplayed);
  // Fresh in its own mode is the same replay as switched to it: not replayed twice.
  const auto& fresh = swap_only.plan().predicted_ns[static_cast<int>(PlanStart::kFresh)];
  EXPECT_EQ(fresh[static_cast<int>(DirectorMode::kSwapOnly)][1], Plan::kNotReplayed);
}

TEST(DeltaPlanning, WhatThePlannerPredictedIsWhatTheIterationsAfterItCost) {
  // The planner replays the learned iteration as delta will run it (mixed while learning, then
  // the candidate) and predicts the candidate's third iteration. A plan that changes the mode,
  // or keeps mode and window, starts from where that iteration started in the replay (its
  // learned times and measured costs), so the run's next iteration is the one predicted: within
  // 0.01 % where the replay's memory matched the run's too (fresh starts), within a few percent
  // where it did not (mixed kept at 12 GB/s ran 46.8 ms against 45.2 predicted, then alternated
  // 46.8 and 52.0 ms). Mixed alternates here: ranked by its third replayed iteration alone
  // (44.4 ms), it was chosen and ran 54.0 ms every iteration; ranked by the second and third
  // together, recompute-only is.
  const Workload w = trainingWorkload(8, 64 * kMiB, 1'000'000);
  for (double gbps : {1.0, 12.0, 50.0}) {
    SimOptions o;
    o.budget_bytes = w.peakBytes() / 2;
    o.h2d_gbps = o.d2h_gbps = gbps;
    o.iterations = 2;
    o.warmup = 1;
    DeltaPolicy delta(configFor(w, o.budget_bytes, gbps), DirectorMode::kMixed);
    const SimResult r = Simulator(w, o).run(delta);
    ASSERT_TRUE(delta.plan().planned) << gbps;
    const std::int64_t predicted = delta.plan().chosenNs();
    const bool fresh = delta.plan().start == PlanStart::kFresh;
    EXPECT_NEAR(static_cast<double>(r.total_ns), static_cast<double>(predicted),
                (fresh ? 1e-4 : 0.05) * static_cast<double>(predicted))
        << gbps << " GB/s, plan " << delta.plan().name();
  }
}

TEST(DeltaPlanning, ANewModeStartsWhereItsReplayedIterationStarted) {
  // What delta learned and measured while learning the iteration describes the old mode. At a
  // switch of mode it takes the times, the measured costs and the link's load of the new mode's
  // replay; at a change of window alone it keeps its own and learns the next iteration again.
  struct Case {
    int layers;
    std::uint64_t act_bytes;
    std::int64_t fwd_ns;
    double share;
    DirectorMode mode;
    Prefetcher::Window window;
  };
  // (8 layers of 256 MiB at 30 % went to recompute-only until evictions ahead stopped taking
  // what the next launch uses: mixed now runs it 0.6 ms faster, and 6 layers make the case.
  // 8 layers of 64 MiB, 5 ms forward, planned mixed/net until room ahead was dated by the
  // need: swap-only now; 32 MiB and 1 ms made the case, until the planner's replays learned
  // their iterations as run, waits included (*One clock*): mixed/gross there now; 6 layers make
  // it.)
  for (const Case& c : {Case{6, 256 * kMiB, 100'000, 0.3, DirectorMode::kRecomputeOnly, Prefetcher::Window::kGross},
                        Case{6, 32 * kMiB, 1'000'000, 0.5, DirectorMode::kMixed, Prefetcher::Window::kNet}}) {
    const Workload w = trainingWorkload(c.layers, c.act_bytes, c.fwd_ns);
    SimOptions o;
    o.budget_bytes = static_cast<std::uint64_t>(c.share * static_cast<double>(w.peakBytes()));
    o.h2d_gbps = o.d2h_gbps = 12.0;
    o.iterations = 1;
    o.warmup = 0;
    DeltaPolicy delta(configFor(w, o.budget_bytes, 12.0), DirectorMode::kMixed);
    const SimResult first = Simulator(w, o).run(delta);
    EXPECT_FALSE(delta.plan().planned);
    delta.onIteration(first.total_ns);  // the second iteration begins: the first is learned
    const Plan& plan = delta.plan();
    ASSERT_TRUE(plan.planned);
    ASSERT_EQ(plan.mode, c.mode);  // the cases are chosen for this
    ASSERT_EQ(plan.window, c.window);
    const UseSchedule& learned = delta.pattern().schedule();
    ASSERT_EQ(plan.learned_offsets_ns.size(), learned.length() + 1u);
    const MeasuredOutcomes now = delta.measuredOutcomes();
    if (c.mode != DirectorMode::kMixed) {
      for (std::uint32_t pos = 0; pos <= learned.length(); ++pos) {
        EXPECT_EQ(learned.offsetNs(pos), plan.learned_offsets_ns[pos]) << pos;
      }
      for (std::uint32_t k = 0; k < MeasuredOutcomes::kSwapClasses; ++k) {
        EXPECT_EQ(now.swap[k].waited_ns, plan.outcomes.swap[k].waited_ns) << k;
        EXPECT_EQ(now.swap[k].expected_ns, plan.outcomes.swap[k].expected_ns) << k;
      }
      EXPECT_EQ(now.recompute.expected_ns, plan.outcomes.recompute.expected_ns);
      EXPECT_EQ(now.urgent_price.waited_ns, plan.outcomes.urgent_price.waited_ns);
      EXPECT_EQ(now.urgent_price.expected_ns, plan.outcomes.urgent_price.expected_ns);
      // The link's recent load too: the old mode's restores are not the new mode's queue.
      EXPECT_GT(plan.outcomes.recent_load_ns, 0.0);
      EXPECT_DOUBLE_EQ(now.recent_load_ns, plan.outcomes.recent_load_ns);
    } else {
      EXPECT_EQ(learned.durationNs(), first.total_ns);  // the real iteration's times
      EXPECT_NE(learned.durationNs(), plan.learned_offsets_ns.back());
    }
  }
}

TEST(DeltaPlanning, APlanThatKeepsModeAndWindowStartsWhereItsReplayedIterationStarted) {
  // Kept mode and window: the replay ran this very iteration the way delta goes on running it,
  // one iteration further; delta takes its learned times and measured costs as at a switch of
  // mode, instead of measuring its way there through the first iteration it knows the pattern
  // of. So does a change to the far window (its room is made by times far ahead, and those
  // learned again from an iteration run by the old window were not the replay's). Another change
  // of window alone still learns the next iteration again. Every shape here whose plan keeps mode
  // and window is checked, and so is every one that changes the window only.
  int kept = 0, window_only = 0, to_far = 0;
  for (std::uint64_t act_bytes : {16 * kMiB, 32 * kMiB}) {
    for (int layers : {4, 6, 8}) {
      for (std::int64_t fwd_ns : {100'000, 1'000'000, 5'000'000}) {
        for (double share : {0.3, 0.5, 0.7}) {
          const Workload w = trainingWorkload(layers, act_bytes, fwd_ns);
          SimOptions o;
          o.budget_bytes = static_cast<std::uint64_t>(share * static_cast<double>(w.peakBytes()));
          o.h2d_gbps = o.d2h_gbps = 12.0;
          o.iterations = 1;
          o.warmup = 0;
          DeltaPolicy delta(configFor(w, o.budget_bytes, 12.0), DirectorMode::kMixed);
          const SimResult first = Simulator(w, o).run(delta);
          delta.onIteration(first.total_ns);
          const Plan& plan = delta.plan();
          if (!plan.planned || plan.mode != DirectorMode::kMixed) continue;
          const UseSchedule& learned = delta.pattern().schedule();
          ASSERT_EQ(plan.learned_offsets_ns.size(), learned.length() + 1u);
          const MeasuredOutcomes now = delta.measuredOutcomes();
          if (plan.window == Prefetcher::Window::kGross || plan.window == Prefetcher::Window::kFar) {
            ++(plan.window == Prefetcher::Window::kGross ? kept : to_far);
            for (std::uint32_t pos = 0; pos <= learned.length(); ++pos) {
              EXPECT_EQ(learned.offsetNs(pos), plan.learned_offsets_ns[pos]) << pos;
            }
            for (std::uint32_t k = 0; k < MeasuredOutcomes::kSwapClasses; ++k) {
              EXPECT_EQ(now.swap[k].expected_ns, plan.outcomes.swap[k].expected_ns) << k;
            }
            EXPECT_EQ(now.urgent_price.expected_ns, plan.outcomes.urgent_price.expected_ns);
            EXPECT_DOUBLE_EQ(now.recent_load_ns, plan.outcomes.recent_load_ns);
          } else {
            ++window_only;
            // The run's own times, learned again next.
            EXPECT_EQ(learned.durationNs(), first.total_ns);
          }
        }
      }
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(window_only, 0);
  EXPECT_GT(to_far, 0);
}

TEST(DeltaPlanning, PlannedElsewhereTheSamePlanIsAdoptedAtTheNextBoundary) {
  // The shim plans on its own thread: the learned iteration becomes a request, and the plan
  // handed back takes effect at the boundary after it, never in between. It is the plan the
  // policy would have made on the spot.
  const Workload w = trainingWorkload(8, 64 * kMiB, 1'000'000);
  for (double gbps : {1.0, 12.0, 50.0}) {
    SimOptions o;
    o.budget_bytes = w.peakBytes() / 2;
    o.h2d_gbps = o.d2h_gbps = gbps;
    o.iterations = 1;
    o.warmup = 0;
    DeltaPolicy on_the_spot(configFor(w, o.budget_bytes, gbps), DirectorMode::kMixed);
    const SimResult first = Simulator(w, o).run(on_the_spot);
    on_the_spot.onIteration(first.total_ns);
    ASSERT_TRUE(on_the_spot.plan().planned) << gbps;

    PolicyConfig config = configFor(w, o.budget_bytes, gbps);
    config.plan_elsewhere = true;
    DeltaPolicy elsewhere(config, DirectorMode::kMixed);
    EXPECT_FALSE(elsewhere.wantsPlan());
    EXPECT_EQ(Simulator(w, o).run(elsewhere).total_ns, first.total_ns);
    elsewhere.onIteration(first.total_ns);
    EXPECT_FALSE(elsewhere.plan().planned);  // asked for, not made
    ASSERT_TRUE(elsewhere.wantsPlan());
    const PlanRequest* request = elsewhere.takePlanRequest();
    ASSERT_NE(request, nullptr);
    EXPECT_FALSE(elsewhere.wantsPlan());
    EXPECT_EQ(elsewhere.takePlanRequest(), nullptr);  // one taker
    EXPECT_EQ(request->budget_bytes, o.budget_bytes);
    EXPECT_EQ(request->generation, elsewhere.pattern().generation());
    EXPECT_EQ(request->schedule.length(), w.ops.size());
    Plan plan = request->run();
    EXPECT_EQ(plan.name(), on_the_spot.plan().name()) << gbps;
    EXPECT_EQ(plan.chosenNs(), on_the_spot.plan().chosenNs()) << gbps;
    elsewhere.deliverPlan(std::move(plan));
    // Launches of the iteration under way do not adopt it.
    Launch launch{first.total_ns + 1, 0, {}};
    elsewhere.onLaunch(launch);
    EXPECT_FALSE(elsewhere.plan().planned);
    EXPECT_EQ(elsewhere.plansAdopted(), 0u);
    elsewhere.onIteration(2 * first.total_ns);
    EXPECT_TRUE(elsewhere.plan().planned);
    EXPECT_EQ(elsewhere.plansAdopted(), 1u);
    EXPECT_EQ(elsewhere.plan().name(), on_the_spot.plan().name());
    EXPECT_EQ(elsewhere.activeMode(), on_the_spot.activeMode());
    EXPECT_EQ(elsewhere.activeWindow(), on_the_spot.activeWindow());
  }
}

// Training loops of the tests below that run delta for many iterations (trainingWorkload's
// arguments): several layers of mid-size activations, many small ones, a few large ones.
struct TrainingShape {
  int layers;
  std::uint64_t act_bytes;
  std::int64_t fwd_ns;
};
constexpr TrainingShape kTrainingShapes[] = {
    {8, 64 * kMiB, 1'000'000}, {12, 16 * kMiB, 200'000}, {6, 256 * kMiB, 5'000'000}};

// Sixteen iterations of `w`, the last four measured, within `share` of its peak on a link of
// `gbps`, planned elsewhere as the shim plans.
struct LongRun {
  SimOptions options;
  PolicyConfig config;
};
LongRun longRunPlannedElsewhere(const Workload& w, double share, double gbps) {
  LongRun run;
  const auto budget = static_cast<std::uint64_t>(share * static_cast<double>(w.peakBytes()));
  run.options.iterations = 16;
  run.options.warmup = 12;
  run.options.budget_bytes = budget;
  run.options.h2d_gbps = run.options.d2h_gbps = gbps;
  run.options.plan_elsewhere = true;
  run.config = configFor(w, budget, gbps);
  run.config.plan_elsewhere = true;
  return run;
}
// Every training shape at 1, 12 and 50 GB/s, 35 and 60 % of its peak, as such a run.
void forEachLongRun(
    const std::function<void(const TrainingShape&, const Workload&, double gbps, double share, const LongRun&)>& f) {
  for (const TrainingShape& c : kTrainingShapes) {
    const Workload w = trainingWorkload(c.layers, c.act_bytes, c.fwd_ns);
    for (double gbps : {1.0, 12.0, 50.0}) {
      for (double share : {0.35, 0.6}) f(c, w, gbps, share, longRunPlannedElsewhere(w, share, gbps));
    }
  }
}

// A planner that misjudged: its plan names the candidate its replays found slowest (switched
// from the configured start, in budget), predicted as fast as the fastest, with no replay's
// state to start from.
class Misplanned : public DeltaPolicy {
 public:
  using DeltaPolicy::DeltaPolicy;
  void deliverPlan(Plan&& plan) override {
    misplan(plan);
    DeltaPolicy::deliverPlan(std::move(plan));
  }
  std::pair<DirectorMode, Prefetcher::Window> slowest{};
  std::int64_t slowest_ns = -1;
  std::int64_t fastest_ns = -1;

 protected:
  void misplan(Plan& plan) {
    const int start = static_cast<int>(PlanStart::kSwitched);
    for (int m = 0; m < 3; ++m) {
      for (int wi = 0; wi < Prefetcher::kWindows; ++wi) {
        const std::int64_t p = plan.predicted_ns[start][m][wi];
        if (p < 0 || plan.over_budget_ops[start][m][wi] > 0) continue;
        if (slowest_ns < 0 || p > slowest_ns) {
          slowest_ns = p;
          slowest = {static_cast<DirectorMode>(m), static_cast<Prefetcher::Window>(wi)};
        }
        if (fastest_ns < 0 || p < fastest_ns) fastest_ns = p;
      }
    }
    if (plan.planned && slowest_ns >= 0) {
      plan.mode = slowest.first;
      plan.window = slowest.second;
      plan.start = PlanStart::kSwitched;
      plan.predicted_ns[start][static_cast<int>(slowest.first)][static_cast<int>(slowest.second)] = fastest_ns;
      plan.learned_offsets_ns.clear();
      plan.learned_waits_ns.clear();
      plan.vetoed.clear();  // searched for the candidate chosen
    }
  }
};

TEST(DeltaPlanning, TheCandidateChosenWasReplayedAsTheRunAdoptingItGoes) {
  // A run adopts its plan's state as the candidate's replay ended, not as the replay switched,
  // and may then run otherwise than the replay's iterations after the switch. The planner
  // replays its candidates again the way the run will go; the one chosen is the fastest
  // of those, and its figures are the run's: iterations 2 and 3 as one, as the replay ranked.
  int checked_again = 0;
  int most_checked = 0;
  int vetoed_rows = 0;
  for (const TrainingShape& c : kTrainingShapes) {
    const Workload w = trainingWorkload(c.layers, c.act_bytes, c.fwd_ns);
    for (double gbps : {1.0, 12.0, 50.0}) {
      for (double share : {0.35, 0.5, 0.7}) {
        SimOptions o;
        o.budget_bytes = static_cast<std::uint64_t>(share * static_cast<double>(w.peakBytes()));
        o.h2d_gbps = o.d2h_gbps = gbps;
        DeltaPolicy delta(policyConfigFor(w, o), DirectorMode::kMixed);
        const SimResult r = Simulator(w, o).run(delta);
        const Plan& p = delta.plan();
        const std::string row = std::to_string(c.layers) + " layers, " + std::to_string(gbps) + " GB/s, " +
                                std::to_string(share) + ": " + p.name();
        ASSERT_TRUE(p.planned) << row;
        const int cs = static_cast<int>(p.start), cm = static_cast<int>(p.mode), cw = static_cast<int>(p.window);
        EXPECT_TRUE(p.checked[cs][cm][cw]) << row;
        // Within 0.5 %: the planner replays the iteration as delta learned it (rebuilt from its
        // times, on the link as measured), not the workload itself. As run: 26 rows within
        // 0.001 %, one (12 layers, 50 GB/s, 35 %: swap-only/net/fresh) 0.22 % slower, where
        // a check of the same plan on the workload itself is exact. Before the check, a run
        // was off its plan's figures by 10 % (gan-21 at 70 %/50 GB/s: 52.7 ms against 47.7).
        // With vetoes, the run is the veto search's last kept replay, faster than the check
        // without them.
        const std::int64_t ranked = p.vetoed.empty() ? p.ranked_ns[cs][cm][cw] : p.vetoed_ranked_ns;
        EXPECT_NEAR(static_cast<double>(r.total_ns), static_cast<double>(ranked), 5e-3 * static_cast<double>(r.total_ns))
            << row;
        if (!p.vetoed.empty()) {
          ++vetoed_rows;
          EXPECT_LT(p.vetoed_ranked_ns, p.ranked_ns[cs][cm][cw]) << row;
          EXPECT_LE(p.vetoed.size(), static_cast<std::size_t>(Planner::kVetoMoves)) << row;
        }
        int checked_in_row = 0;
        for (int s = 0; s < 2; ++s) {
          for (int m = 0; m < 3; ++m) {
            for (int wi = 0; wi < Prefetcher::kWindows; ++wi) {
              if (!p.checked[s][m][wi]) continue;
              ++checked_in_row;
              if (s == cs && m == cm && wi == cw) continue;
              ++checked_again;
              // No faster over the two iterations than the chosen one as adopted (with its
              // vetoes, which may make a candidate slower without them the fastest).
              if (p.over_budget_ops[s][m][wi] == p.over_budget_ops[cs][cm][cw]) {
                EXPECT_GE(p.ranked_ns[s][m][wi], ranked) << row;
              }
            }
          }
        }
        most_checked = std::max(most_checked, checked_in_row);
      }
    }
  }
  EXPECT_GE(checked_again, 1);
  // Every candidate that kept the budget as well as the best is checked, not the best few: on
  // some rows more than three (a check slower than the fastest so far is cut short, and keeps
  // its first figures unmarked).
  EXPECT_GT(most_checked, 3);
  EXPECT_GE(vetoed_rows, 8);  // the veto search kept some: as run, on 15 of the 27 rows
}

TEST(DeltaPlanning, ACandidateThatWaitsMoreThanAnotherIsPredictedToIsLeftForIt) {
  // The planner predicts from three replayed iterations; the run measures every iteration it
  // runs. A candidate whose iterations wait clearly longer than another candidate is predicted
  // to (or was measured to) is left for that one, a few times at most. Here the plan lies: it
  // runs the slowest candidate, said to be as fast as the fastest. The run must leave it and
  // settle near the fastest; where all candidates are alike, it keeps the one planned.
  int left = 0;
  forEachLongRun([&](const TrainingShape& c, const Workload& w, double gbps, double share, const LongRun& run) {
    const SimOptions& o = run.options;
    const PolicyConfig& config = run.config;
    Misplanned delta(config, DirectorMode::kMixed);
    const SimResult r = Simulator(w, o).run(delta);
    const std::string row = std::to_string(c.layers) + " layers, " + std::to_string(gbps) + " GB/s, " +
                            std::to_string(share) + ": " + delta.plan().name();
    ASSERT_GE(delta.slowest_ns, 0) << row;
    EXPECT_EQ(r.over_budget_ops, 0u) << row;
    const double per_iteration = static_cast<double>(r.total_ns) / 4;
    const auto slowest = static_cast<double>(delta.slowest_ns);
    const auto fastest = static_cast<double>(delta.fastest_ns);
    if (slowest == fastest) {
      EXPECT_EQ(delta.planSwitches(), 0u) << row;
      return;
    }
    if (slowest < 1.25 * fastest) return;  // within what a prediction is trusted to
    ++left;
    EXPECT_GE(delta.planSwitches(), 1u) << row;
    EXPECT_LT(per_iteration, 0.96 * slowest) << row;
    EXPECT_LT(per_iteration, 1.2 * fastest) << row;
  });
  EXPECT_GE(left, 8);
}

// A plan with no candidate but the one chosen (the others' predictions taken out), and with
// `bad_vetoes`, vetoes that misjudge the run: they keep resident the first half of the
// activations, the buffers used farthest ahead (trainingWorkload's ids after its weights and
// input), and say the candidate runs as fast with them as without.
class OnlyTheChosen : public DeltaPolicy {
 public:
  OnlyTheChosen(const PolicyConfig& config, int layers, bool bad_vetoes)
      : DeltaPolicy(config, DirectorMode::kMixed), layers_(layers), bad_vetoes_(bad_vetoes) {}
  void deliverPlan(Plan&& plan) override {
    if (plan.planned) {
      const int cs = static_cast<int>(plan.start), cm = static_cast<int>(plan.mode), cw = static_cast<int>(plan.window);
      for (int s = 0; s < 2; ++s) {
        for (int m = 0; m < 3; ++m) {
          for (int w = 0; w < Prefetcher::kWindows; ++w) {
            if (m != cm || w != cw) plan.predicted_ns[s][m][w] = Plan::kNotReplayed;
          }
        }
      }
      plan.vetoed.clear();
      if (bad_vetoes_) {
        for (int i = 0; i < layers_ / 2; ++i) plan.vetoed.push_back(static_cast<BufferId>(layers_ + 1 + i));
        plan.vetoed_ns = plan.predicted_ns[cs][cm][cw];
      }
    }
    DeltaPolicy::deliverPlan(std::move(plan));
  }

 private:
  int layers_;
  bool bad_vetoes_;
};

TEST(DeltaPlanning, VetoesThatMakeTheRunSlowerThanPredictedWithoutThemAreDropped) {
  // The veto search keeps a veto for a faster replay of two iterations; the run goes on for
  // thousands. Where the run with the vetoes waits clearly longer than the chosen candidate is
  // predicted to without them, they are dropped, and the run goes on as without them. No other
  // candidate to switch to here: dropping them is the only way out.
  int dropped = 0;
  forEachLongRun([&](const TrainingShape& c, const Workload& w, double gbps, double share, const LongRun& run) {
    const SimOptions& o = run.options;
    const PolicyConfig& config = run.config;
    OnlyTheChosen plain(config, c.layers, false);
    const SimResult good = Simulator(w, o).run(plain);
    OnlyTheChosen vetoed(config, c.layers, true);
    const SimResult bad = Simulator(w, o).run(vetoed);
    const std::string row = std::to_string(c.layers) + " layers, " + std::to_string(gbps) + " GB/s, " +
                            std::to_string(share) + ": " + vetoed.runningPlan();
    EXPECT_EQ(bad.over_budget_ops, 0u) << row;
    EXPECT_EQ(bad.used_while_evicted, 0u) << row;
    EXPECT_EQ(vetoed.plan().mode, plain.plan().mode) << row;
    EXPECT_EQ(vetoed.plan().window, plain.plan().window) << row;
    const bool kept = vetoed.runningPlan().find("/vetoed-") != std::string::npos;
    if (!kept) {
      ++dropped;
      EXPECT_EQ(vetoed.planSwitches(), 1u) << row;
    }
    // As run: within 8 % of the plan without them on every row (kept on three, where they
    // cost under 1.3 % or gained); without the drop, up to 6.6 times slower.
    EXPECT_LT(static_cast<double>(bad.total_ns), 1.1 * static_cast<double>(good.total_ns)) << row;
  });
  EXPECT_GE(dropped, 4);
}

// Misplanned, with vetoes that say the candidate named runs as fast with them as the fastest
// (the first half of the activations, as OnlyTheChosen's bad ones), and what each iteration
// boundary found: the candidate running, whether it is the one named, how many buffers vetoed.
class MisplannedWithVetoes : public Misplanned {
 public:
  MisplannedWithVetoes(const PolicyConfig& config, int layers)
      : Misplanned(config, DirectorMode::kMixed), layers_(layers) {}
  void deliverPlan(Plan&& plan) override {
    misplan(plan);
    if (plan.planned && slowest_ns >= 0) {
      for (int i = 0; i < layers_ / 2; ++i) plan.vetoed.push_back(static_cast<BufferId>(layers_ + 1 + i));
      plan.vetoed_ns = fastest_ns;
    }
    DeltaPolicy::deliverPlan(std::move(plan));
  }
  void onIteration(std::int64_t now_ns) override {
    DeltaPolicy::onIteration(now_ns);
    if (!plan().planned) return;
    const bool named = activeMode() == slowest.first && activeWindow() == slowest.second;
    boundaries.push_back({runningPlan(), named, vetoedCount()});
  }
  struct Boundary {
    std::string running;
    bool named = false;
    std::size_t vetoed = 0;
  };
  std::vector<Boundary> boundaries;

 protected:
  int layers_;
};

// The planner's own choice, with vetoes (its own, or the weights and the input where it kept
// none), and a lure: the slowest candidate predicted to wait nothing. A run that waits at all
// leaves the choice for the lure, measures it slow, and comes back to the choice, or goes on to
// another candidate.
class Lured : public MisplannedWithVetoes {
 public:
  using MisplannedWithVetoes::MisplannedWithVetoes;
  void deliverPlan(Plan&& plan) override {
    Plan probe = plan;
    misplan(probe);  // finds the slowest candidate switched to, and names it in `slowest`
    if (plan.planned && slowest_ns >= 0 && (slowest.first != plan.mode || slowest.second != plan.window)) {
      plan.predicted_ns[static_cast<int>(PlanStart::kSwitched)][static_cast<int>(slowest.first)]
                       [static_cast<int>(slowest.second)] = plan.compute_ns;
      if (plan.vetoed.empty()) {
        for (int i = 0; i <= layers_; ++i) plan.vetoed.push_back(static_cast<BufferId>(i));
        plan.vetoed_ns = plan.predicted_ns[static_cast<int>(plan.start)][static_cast<int>(plan.mode)]
                                          [static_cast<int>(plan.window)];
      }
      slowest = {plan.mode, plan.window};  // the candidate the vetoes were searched for
    } else {
      slowest_ns = -1;
    }
    DeltaPolicy::deliverPlan(std::move(plan));
  }
};

// Over one run: whether it left the candidate its vetoes were searched for, and whether it came
// back to it with them. At every boundary the policy's own vetoed set must agree with the
// candidate running and with the name it reports.
struct VetoesOverRun {
  bool left = false;
  bool came_back_vetoed = false;
};
VetoesOverRun checkVetoesAtEachBoundary(const MisplannedWithVetoes& delta, const std::string& row) {
  VetoesOverRun seen;
  for (std::size_t i = 0; i < delta.boundaries.size(); ++i) {
    const auto& b = delta.boundaries[i];
    const std::string at = row + ", boundary " + std::to_string(i) + ": " + b.running;
    EXPECT_EQ(b.vetoed > 0, b.running.find("/vetoed-") != std::string::npos) << at;
    if (!b.named) {
      EXPECT_EQ(b.vetoed, 0u) << at;
      seen.left = true;
    } else if (seen.left && b.vetoed > 0) {
      seen.came_back_vetoed = true;
    }
  }
  return seen;
}

TEST(DeltaPlanning, VetoesHoldOnlyWhileTheCandidateTheyWereSearchedForRuns) {
  // The veto search keeps vetoes for the candidate chosen; a run that leaves it for another
  // (checkPlan) leaves its vetoes too, and a run that comes back to it finds them again, unless
  // they were dropped for good. Checked at every iteration boundary, on the policy's own set.
  int left = 0;
  int lured = 0;
  int came_back = 0;
  forEachLongRun([&](const TrainingShape& c, const Workload& w, double gbps, double share, const LongRun& run) {
    const std::string row = std::to_string(c.layers) + " layers, " + std::to_string(gbps) + " GB/s, " +
                            std::to_string(share);
    // Sent to the slowest candidate with vetoes: it leaves it, and them.
    MisplannedWithVetoes misplanned(run.config, c.layers);
    SimResult r = Simulator(w, run.options).run(misplanned);
    if (misplanned.slowest_ns >= 0) {
      EXPECT_EQ(r.over_budget_ops, 0u) << row;
      EXPECT_EQ(r.used_while_evicted, 0u) << row;
      if (checkVetoesAtEachBoundary(misplanned, row + ", misplanned").left) ++left;
    }
    // Lured away from the planner's choice and back.
    Lured lure(run.config, c.layers);
    r = Simulator(w, run.options).run(lure);
    if (lure.slowest_ns >= 0) {
      EXPECT_EQ(r.over_budget_ops, 0u) << row;
      EXPECT_EQ(r.used_while_evicted, 0u) << row;
      const VetoesOverRun seen = checkVetoesAtEachBoundary(lure, row + ", lured");
      if (seen.left) ++lured;
      if (seen.came_back_vetoed) ++came_back;
    }
  });
  // As run: left on 13 rows of 18, lured away on 15, back with the vetoes on 10.
  EXPECT_GE(left, 8);
  EXPECT_GE(lured, 8);
  EXPECT_GE(came_back, 5);
}

// Device times come late, as in the shim (once the device has run the launches), not from the
// simulator as each launch is replayed: they are reported by hand.
class TimedLater : public DeltaPolicy {
 public:
  using DeltaPolicy::DeltaPolicy;
  bool wantsLaunchTimes() const override { return false; }
};

// Half the workload's peak, `iterations` replayed, none left out.
SimOptions halfBudget(const Workload& w, std::uint32_t iterations) {
  SimOptions o;
  o.budget_bytes = w.peakBytes() / 2;
  o.iterations = iterations;
  o.warmup = 0;
  return o;
}

// As the shim configures delta: plans made by the caller, launches timed by the device.
PolicyConfig plannedElsewhereWithDeviceTimes(const Workload& w, const SimOptions& o) {
  PolicyConfig config = configFor(w, o.budget_bytes, 12.0);
  config.plan_elsewhere = true;
  config.timed_launches = true;
  return config;
}

TEST(DeltaPlanning, WithDeviceTimesTheRequestWaitsForThemAndCarriesThem) {
  // A caller that reports device times (the shim): the iteration learned is timed by the host
  // until its launches' device times come, and a plan made on the host's times plans another
  // workload. The request waits for them, and its ops take the times the device reported.
  for (std::int64_t op_ns : {200'000, 3'000'000}) {
    const Workload w = trainingWorkload(8, 64 * kMiB, 1'000'000);
    const SimOptions o = halfBudget(w, 1);
    const PolicyConfig config = plannedElsewhereWithDeviceTimes(w, o);
    TimedLater policy(config, DirectorMode::kMixed);
    const SimResult first = Simulator(w, o).run(policy);
    policy.onIteration(first.total_ns);
    ASSERT_TRUE(policy.pattern().schedule().ready());
    const std::uint32_t launches = policy.pattern().schedule().length();
    EXPECT_FALSE(policy.wantsPlan()) << "asked for a plan before the device's times";
    // The device ran each launch in op_ns, after a wait of as long again; every fifth after
    // work the policy was not told of (the gap is not all waiting).
    for (std::uint32_t k = 0; k < launches; ++k) {
      const std::int64_t end = 2 * static_cast<std::int64_t>(k + 1) * op_ns;
      policy.onLaunchTimed(k, end - op_ns, end, k % 5 != 4);
    }
    ASSERT_TRUE(policy.wantsPlan());
    const PlanRequest* request = policy.takePlanRequest();
    ASSERT_NE(request, nullptr);
    ASSERT_EQ(request->schedule.length(), launches);
    // Each where it started on the device (the waits too), through the end of the last.
    for (std::uint32_t k = 0; k < launches; ++k) EXPECT_EQ(request->schedule.offsetNs(k), 2 * k * op_ns);
    EXPECT_EQ(request->schedule.durationNs(), (2 * launches - 1) * op_ns);
    // The waits are the device's, though the policy was told of none of them (a host that fell
    // behind, a copy out waited for): the planner's ops run what the device ran, op_ns each.
    // After unseen work, the waits the policy was told of, as a policy without device times
    // (the same run) has them.
    PolicyConfig untimed = config;
    untimed.timed_launches = false;
    DeltaPolicy told(untimed, DirectorMode::kMixed);
    Simulator(w, o).run(told);
    told.onIteration(first.total_ns);
    const PlanRequest* told_request = told.takePlanRequest();
    ASSERT_NE(told_request, nullptr);
    ASSERT_GE(request->waited_ns.size(), launches);
    ASSERT_GE(told_request->waited_ns.size(), launches);
    for (std::uint32_t k = 0; k < launches; ++k) {
      EXPECT_EQ(request->waited_ns[k], k % 5 == 4 ? told_request->waited_ns[k] : k == 0 ? 0 : op_ns) << k;
    }
    const Workload planned = Planner::workloadFrom(request->schedule, request->buffers, request->waited_ns);
    ASSERT_EQ(planned.ops.size(), launches);
    for (std::uint32_t k = 0; k + 1 < launches; ++k) {
      if ((k + 1) % 5 != 4) {
        EXPECT_EQ(planned.ops[k].compute_ns, op_ns) << k;
      }
    }
  }
}

TEST(DeltaPlanning, APlanWaitsForTimesReportedInFullOrASecondTiming) {
  // Launches that ran before any was marked (memory not short yet) keep the host's intervals,
  // which in a program's first iteration hold its setup: the request waits for an iteration the
  // device timed in full, or for the second timing if none comes whole (marks the host outran).
  const Workload w = trainingWorkload(8, 64 * kMiB, 1'000'000);
  for (std::uint32_t unmarked : {1u, 5u}) {
    for (bool second_whole : {true, false}) {
      SCOPED_TRACE(::testing::Message() << unmarked << " unmarked, second " << (second_whole ? "whole" : "partial"));
      const SimOptions o = halfBudget(w, 2);
      TimedLater policy(plannedElsewhereWithDeviceTimes(w, o), DirectorMode::kMixed);
      // Two iterations run (the first learned at the second's start), the device behind.
      const SimResult run = Simulator(w, o).run(policy);
      const std::uint32_t n = policy.pattern().schedule().length();
      ASSERT_EQ(n, w.ops.size());
      auto report = [&](std::uint64_t launch) {
        const auto end = static_cast<std::int64_t>(launch + 1) * 1'000'000;
        policy.onLaunchTimed(launch, end - 1'000'000, end);
      };
      // The first iteration, less its first launches; a launch of the second completes it.
      for (std::uint64_t k = unmarked; k < n; ++k) report(k);
      EXPECT_EQ(policy.pattern().deviceTimed(), 0u);
      report(n + (second_whole ? 0 : 1));
      ASSERT_EQ(policy.pattern().deviceTimed(), 1u);
      EXPECT_FALSE(policy.pattern().deviceTimedInFull());
      EXPECT_FALSE(policy.wantsPlan()) << "planned on the host's intervals of unmarked launches";
      // The second iteration (the learned one repeated), whole or but for one launch, and its
      // end; without one of its reports, a launch of a third iteration ends the wait for them.
      for (std::uint64_t k = n + 1; k < 2 * n; ++k) report(k);  // the second's first: above, or never
      policy.onIteration(run.total_ns);
      if (!second_whole) {
        policy.onLaunch(Launch{run.total_ns + 1, 0, {}});
        report(2 * n);
      }
      ASSERT_EQ(policy.pattern().deviceTimed(), 2u);
      EXPECT_EQ(policy.pattern().deviceTimedInFull(), second_whole);
      ASSERT_TRUE(policy.wantsPlan());
      const PlanRequest* request = policy.takePlanRequest();
      ASSERT_NE(request, nullptr);
      EXPECT_EQ(request->schedule.durationNs(), static_cast<std::int64_t>(n) * 1'000'000);
    }
  }
}

TEST(DeltaPlanning, PlannedElsewhereCostsOneIterationNotTheSteadyState) {
  // The replay of planning elsewhere (SimOptions::plan_elsewhere: the plan ready within the
  // iteration, adopted at the next boundary) reaches the state planning on the spot reaches,
  // an iteration later. Measured over six iterations after ten: single iterations of delta
  // swing by up to 2x from one to the next on some rows (the state it carries over), and a
  // candidate that runs slower than another's prediction is left for it (DeltaPolicy::checkPlan),
  // each switch an iteration later too.
  int changed_mode = 0;
  int elsewhere_faster = 0;
  for (const TrainingShape& c : kTrainingShapes) {
    const Workload w = trainingWorkload(c.layers, c.act_bytes, c.fwd_ns);
    for (double gbps : {1.0, 12.0, 50.0}) {
      for (double share : {0.35, 0.6}) {
        SimOptions o;
        o.iterations = 16;
        o.warmup = 10;
        const auto budget = static_cast<std::uint64_t>(share * static_cast<double>(w.peakBytes()));
        const SimResult spot = replay(w, "delta", budget, gbps, budget, o);
        o.plan_elsewhere = true;
        const SimResult elsewhere = replay(w, "delta", budget, gbps, budget, o);
        const std::string row = std::to_string(c.layers) + " layers, " + std::to_string(gbps) + " GB/s, " +
                                std::to_string(share);
        EXPECT_EQ(elsewhere.over_budget_ops, 0u) << row;
        EXPECT_EQ(elsewhere.used_while_evicted, 0u) << row;
        // Never slower than on the spot. Faster on one row: 12 layers at 12 GB/s, 35 %, whose plan
        // vetoes four buffers; adopted on the spot it ran its two checked iterations as replayed
        // (15.4 and 13.3 ms), then 19.1 and, its vetoes dropped (checkPlan), 18.3 ms each; adopted
        // an iteration later, 13.3 ms from then on. Without vetoes both ran 18.9 ms.
        EXPECT_LE(static_cast<double>(elsewhere.total_ns), 1.02 * static_cast<double>(spot.total_ns)) << row;
        if (static_cast<double>(elsewhere.total_ns) < 0.98 * static_cast<double>(spot.total_ns)) ++elsewhere_faster;
        PolicyConfig config = configFor(w, budget, gbps);
        DeltaPolicy probe(config, DirectorMode::kMixed);
        o.plan_elsewhere = false;
        o.budget_bytes = budget;
        o.h2d_gbps = o.d2h_gbps = gbps;
        o.iterations = 2;
        Simulator(w, o).run(probe);
        if (probe.activeMode() != DirectorMode::kMixed) ++changed_mode;
      }
    }
  }
  EXPECT_GE(changed_mode, 4);  // the rows include switches of mode, not only of window
  EXPECT_LE(elsewhere_faster, 1);
}

TEST(DeltaPlanning, APlanForAnOlderIterationSetsTheModeAndTheNewerIsAskedFor) {
  // While the caller plans, the loop changes: the plan still comes in at the next boundary
  // (better than none), without the replay's times (they describe the other iteration).
  const Workload a = trainingWorkload(8, 64 * kMiB, 1'000'000);
  const Workload b = trainingWorkload(10, 64 * kMiB, 1'000'000);
  SimOptions o;
  o.budget_bytes = a.peakBytes() / 2;
  o.h2d_gbps = o.d2h_gbps = 12.0;
  o.iterations = 1;
  o.warmup = 0;
  PolicyConfig config = configFor(b, o.budget_bytes, 12.0);  // b has more buffers
  config.plan_elsewhere = true;
  DeltaPolicy delta(config, DirectorMode::kMixed);
  std::int64_t now = Simulator(a, o).run(delta).total_ns;
  delta.onIteration(now);
  const PlanRequest* request = delta.takePlanRequest();
  ASSERT_NE(request, nullptr);
  const std::uint32_t planned_generation = request->generation;
  Plan plan = request->run();
  ASSERT_TRUE(plan.planned);
  // The next iteration is another: learned at its end, not requested while one is out.
  now += Simulator(b, o).run(delta).total_ns;
  delta.onIteration(now);
  ASSERT_NE(delta.pattern().generation(), planned_generation);
  EXPECT_FALSE(delta.wantsPlan());
  EXPECT_FALSE(delta.plan().planned);
  const std::int64_t learned_ns = delta.pattern().schedule().durationNs();
  const std::string name = plan.name();
  delta.deliverPlan(std::move(plan));
  delta.onIteration(now + 1);
  EXPECT_TRUE(delta.plan().planned);
  EXPECT_EQ(delta.plan().name(), name);
  // b's iteration keeps its own times: the replay's were a's (of another length, too).
  EXPECT_EQ(delta.pattern().schedule().durationNs(), learned_ns);
  // The newer iteration ran the old way. A plan that changes the mode or the window has the
  // next iteration learned again and stands on it (as planned on the spot); one that changes
  // neither leaves the newer iteration to be planned now.
  const bool relearns = delta.activeMode() != DirectorMode::kMixed || delta.activeWindow() != Prefetcher::Window::kGross;
  EXPECT_EQ(delta.wantsPlan(), !relearns);
  if (relearns) {
    delta.onIteration(now + 2);  // learned again: the plan stands
    EXPECT_FALSE(delta.wantsPlan());
    EXPECT_EQ(delta.plan().name(), name);
  } else {
    const PlanRequest* newer = delta.takePlanRequest();
    ASSERT_NE(newer, nullptr);
    EXPECT_EQ(newer->generation, delta.pattern().generation());
    EXPECT_EQ(newer->schedule.length(), b.ops.size());
  }
}

TEST(DeltaPlanning, RecomputeOnlyAsAPlanSwapsWhatDropsCannotFree) {
  // Buffers no hook regenerates (weights, the input) cannot be dropped. The variant asked for
  // runs over the budget then; delta, having planned recompute-only, swaps them when memory is
  // needed at once, after every drop, and keeps the budget. (The planner chose recompute-only
  // here until evictions ahead stopped taking what the next launch uses; mixed is now 0.2 %
  // faster, so the plan is set as the planner's replays set it.)
  const Workload w = trainingWorkload(8, 256 * kMiB, 100'000);
  for (double share : {0.3, 0.35}) {
    const auto budget = static_cast<std::uint64_t>(share * static_cast<double>(w.peakBytes()));
    const SimResult forced = replay(w, "recompute-only", budget, 12.0, budget);
    EXPECT_GT(forced.over_budget_ops, 0u) << share;
    EXPECT_EQ(forced.swaps, 0u);
    DeltaPolicy delta(configFor(w, 0, 12.0), DirectorMode::kMixed);
    delta.switchWhenLearned(DirectorMode::kRecomputeOnly);
    SimOptions o;
    o.budget_bytes = budget;
    o.h2d_gbps = o.d2h_gbps = 12.0;
    const SimResult planned = Simulator(w, o).run(delta);
    ASSERT_EQ(delta.activeMode(), DirectorMode::kRecomputeOnly) << share;
    EXPECT_EQ(planned.over_budget_ops, 0u) << share;
    EXPECT_EQ(planned.used_while_evicted, 0u);
    EXPECT_GT(planned.swaps, 0u);
    EXPECT_GT(planned.drops, planned.swaps);
  }
}

// A training iteration whose optimizer state (`state_bytes` per layer, persistent, no hook) is
// read only by the step at the end, and whose activations are cheap to recompute: dropping the
// activations is right; the state has to be swapped, and its copies can hide behind compute.
Workload withOptimizerState(int layers, std::uint64_t act_bytes, std::int64_t fwd_ns, std::uint64_t state_bytes) {
  WorkloadBuilder b;
  std::vector<BufferId> weights, state, acts;
  for (int i = 0; i < layers; ++i) weights.push_back(b.persistent("w" + std::to_string(i), 4 * kMiB));
  for (int i = 0; i < layers; ++i) state.push_back(b.persistent("m" + std::to_string(i), state_bytes));
  const BufferId input = b.persistent("input", act_bytes);
  BufferId prev = input;
  for (int i = 0; i < layers; ++i) {
    prev = b.op("fwd" + std::to_string(i), fwd_ns, {prev, weights[static_cast<std::size_t>(i)]}, {act_bytes})[0];
    acts.push_back(prev);
  }
  BufferId grad = b.op("loss", fwd_ns, {prev}, {act_bytes})[0];
  for (int i = layers - 1; i >= 0; --i) {
    const auto k = static_cast<std::size_t>(i);
    const BufferId in = i > 0 ? acts[k - 1] : input;
    const BufferId g = b.op("bwd" + std::to_string(i), 2 * fwd_ns, {grad, in, weights[k]}, {act_bytes})[0];
    b.free(grad);
    b.free(acts[k]);
    grad = g;
  }
  for (int i = 0; i < layers; ++i) {
    const auto k = static_cast<std::size_t>(i);
    b.op("step" + std::to_string(i), fwd_ns, {grad}, {}, {weights[k], state[k]}, false);
  }
  b.free(grad);
  return b.take();
}

TEST(DeltaPlanning, RecomputeOnlyAsAPlanBringsBackWhatItSwappedAhead) {
  // Drops for the activations, swaps for the optimizer state: the state is read once, at the
  // end, so its copies back can be made while the backward runs. A recompute-only plan that
  // swapped it used to restore it only when the step needed it, in full view (no prefetch in
  // that mode). Now it comes back ahead like any swap.
  // Several shapes; simulated time only.
  struct Shape {
    int layers;
    std::uint64_t act_mib, state_mib;
    std::int64_t fwd_ns;
    double share;
  };
  std::vector<Shape> shapes = {{4, 128, 64, 2'000'000, 0.5}, {6, 256, 128, 4'000'000, 0.45},
                               {8, 64, 96, 1'000'000, 0.55}, {5, 192, 160, 3'000'000, 0.5}};
  // And seeded ones (a fixed LCG): 4-8 layers, activations 64-256 MiB, state 64-192 MiB, 1-4 ms
  // a layer, budgets 45-55 % of the peak.
  std::uint64_t x = 17;
  auto next = [&x](std::uint64_t n) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return (x >> 33) % n;
  };
  for (int seed = 0; seed < 8; ++seed) {
    shapes.push_back({4 + static_cast<int>(next(5)), 64 + 64 * next(4), 64 + 32 * next(5),
                      1'000'000 + 1'000'000 * static_cast<std::int64_t>(next(4)), 0.45 + 0.05 * static_cast<double>(next(3))});
  }
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const Shape& shape = shapes[i];
    const bool chosen = i < 4;  // the hand-made shapes need swaps and hide enough for the bound below
    const Workload w = withOptimizerState(shape.layers, shape.act_mib * kMiB, shape.fwd_ns, shape.state_mib * kMiB);
    const auto budget = static_cast<std::uint64_t>(shape.share * static_cast<double>(w.peakBytes()));
    SimOptions o;
    o.budget_bytes = budget;
    o.h2d_gbps = o.d2h_gbps = 12.0;
    DeltaPolicy delta(configFor(w, 0, 12.0), DirectorMode::kMixed);  // no planning: the plan is set
    delta.switchWhenLearned(DirectorMode::kRecomputeOnly);
    const SimResult r = Simulator(w, o).run(delta);
    ASSERT_EQ(delta.activeMode(), DirectorMode::kRecomputeOnly);
    EXPECT_EQ(r.over_budget_ops, 0u) << shape.layers;
    EXPECT_EQ(r.used_while_evicted, 0u);
    EXPECT_GT(r.drops, 0u) << shape.layers;  // the activations are dropped...
    if (!chosen && r.swaps == 0) continue;  // a seeded budget the drops meet alone
    ASSERT_GT(r.swaps, 0u) << shape.layers;  // ...the state, which no hook makes, swapped...
    EXPECT_GT(r.prefetches, 0u) << shape.layers;  // ...and brought back ahead of the step
    const auto on_demand_ns = static_cast<std::int64_t>(static_cast<double>(r.h2d_bytes) / 12.0);
    // Restored on demand, every swapped byte stalls twice: its copy out (the plan swaps only
    // when memory is needed at once, after every drop) and its copy back. Some of the copies
    // back now hide behind the backward (before this change: none, the stall was within 6 % of
    // both transfers in full; after, 7-45 % below).
    const auto out_ns = static_cast<std::int64_t>(static_cast<double>(r.d2h_bytes) / 12.0);
    EXPECT_LT(r.stall_ns, out_ns + on_demand_ns - (chosen ? on_demand_ns / 8 : 0)) << i;
  }
}

}  // namespace
}  // namespace delta::policy
