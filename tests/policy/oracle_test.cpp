// The oracle policy (policy/oracle_policy.h) against the exact lower bound (tools/exact_bound.h)
// and against every other policy, on random small workloads over several seeds and shapes:
// - where the bound says a plan fits, the oracle stays in budget;
// - the oracle is never faster than the bound (the bound is a lower bound of the same model);
// - the oracle is never slower than another policy that stays in budget.
// The gap to the bound is printed (median, 90th percentile, worst). No timing assertions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "policy/oracle_policy.h"
#include "policy/policy_factory.h"
#include "policy/simulator.h"
#include "tests/policy/workload_builder.h"
#include "tools/exact_bound.h"

namespace delta::policy {
namespace {

using testing::randomGraph;
using testing::randomTraining;
constexpr std::uint64_t kMiB = 1u << 20;

struct Case {
  Workload workload;
  SimOptions options;
  std::string label;
};

// Seeds x shapes x budgets x links, small enough for the exact bound (tens of ops).
std::vector<Case> cases() {
  std::vector<Case> out;
  for (std::uint32_t seed = 1; seed <= 10; ++seed) {
    for (int shape = 0; shape < 2; ++shape) {
      std::mt19937 rng(seed * 7919u + static_cast<std::uint32_t>(shape));
      Workload w = shape == 0 ? randomTraining(rng, 3 + static_cast<int>(seed % 4))
                              : randomGraph(rng, 10 + static_cast<int>(seed % 3) * 4);
      EXPECT_EQ(w.validate(), "") << seed << " " << shape;
      for (double share : {0.5, 0.7, 0.9}) {
        for (double gbps : {12.0, 50.0}) {
          Case c{w, {}, {}};
          c.options.budget_bytes = static_cast<std::uint64_t>(share * static_cast<double>(w.peakBytes()));
          c.options.h2d_gbps = c.options.d2h_gbps = gbps;
          c.options.iterations = 1;  // the bound's model: one iteration from the start
          c.options.warmup = 0;
          c.label = "seed " + std::to_string(seed) + (shape == 0 ? " training" : " graph") + " " +
                    std::to_string(static_cast<int>(share * 100)) + "% " + std::to_string(static_cast<int>(gbps)) +
                    " GB/s";
          out.push_back(std::move(c));
        }
      }
    }
  }
  return out;
}

SimResult replay(const Workload& w, std::string_view name, const SimOptions& o) {
  const UseSchedule future = w.schedule();
  const ReplayContext context{&w, o};
  PolicyResult p = makePolicy(name, policyConfigFor(w, o), &future, &context);
  EXPECT_EQ(p.error, "") << name;
  Simulator sim(w, o);
  return sim.run(*p.policy);
}

// The options of a sweep at `share` of the peak and `gbps` each way.
SimOptions optionsAt(const Workload& w, double share, double gbps) {
  SimOptions o;
  o.budget_bytes = static_cast<std::uint64_t>(share * static_cast<double>(w.peakBytes()));
  o.h2d_gbps = o.d2h_gbps = gbps;
  return o;
}

// The oracle as delta-trace builds it (makePolicy), its search and its outer replay.
struct OracleRun {
  PolicyResult made;
  SimResult result;
  const OracleChoice& choice() const { return dynamic_cast<const OracleChoice&>(*made.policy); }
};
OracleRun runOracle(const Workload& w, const SimOptions& o) {
  const UseSchedule future = w.schedule();
  const ReplayContext context{&w, o};
  OracleRun run{makePolicy("oracle", policyConfigFor(w, o), &future, &context), {}};
  run.result = Simulator(w, o).run(*run.made.policy);
  return run;
}

TEST(OracleFactory, OnlyInReplay) {
  const PolicyResult online = makePolicy("oracle", PolicyConfig{});
  EXPECT_EQ(online.policy, nullptr);
  EXPECT_EQ(online.error, "policy 'oracle' needs the future and is available only in replay (delta-trace)");
  Workload w = testing::trainingWorkload(3, 4 * kMiB, 1000000);
  const UseSchedule future = w.schedule();
  EXPECT_EQ(makePolicy("oracle", PolicyConfig{}, &future).policy, nullptr);  // the future alone is not enough
  SimOptions o;
  const ReplayContext context{&w, o};
  PolicyResult p = makePolicy("oracle", policyConfigFor(w, o), &future, &context);
  ASSERT_NE(p.policy, nullptr);
  EXPECT_EQ(p.policy->name(), "oracle");
}

// The outer replay reproduces the chosen candidate's run: the search is deterministic.
TEST(Oracle, ReplaysItsBestCandidate) {
  Workload w = testing::trainingWorkload(6, 8 * kMiB, 1000000);
  SimOptions o;
  o.budget_bytes = w.peakBytes() / 2;
  const OracleRun run = runOracle(w, o);
  const SimResult& r = run.result;
  std::int64_t best = -1;
  for (const OracleCandidate& c : run.choice().candidates()) {
    if (c.result.gave_up || c.result.over_budget_ops > 0) continue;
    if (best < 0 || c.result.total_ns < best) best = c.result.total_ns;
  }
  EXPECT_EQ(r.total_ns, best);
  EXPECT_EQ(r.over_budget_ops, 0u);
}

// Records every rating a rule makes, to check what the gated rules allow.
class RatingSpy : public OracleRulePolicy {
 public:
  RatingSpy(const PolicyConfig& config, const Workload& workload, OracleRule rule)
      : OracleRulePolicy(config, workload, rule), future_(workload.schedule()) {}
  void onLaunch(const Launch& launch) override {
    ++position_;  // as the oracle counts: a launch's buffers are next used after it
    OracleRulePolicy::onLaunch(launch);
  }
  void onIteration(std::int64_t now_ns) override {
    position_ = 0;
    OracleRulePolicy::onIteration(now_ns);
  }
  struct Seen {
    bool urgent;
    bool eligible;
    Action action;
    double score;
    std::int64_t recompute_ns;
    std::uint64_t bytes;
    bool reused;  // used again before it is freed (else a drop costs nothing)
  };
  mutable std::vector<Seen> seen;

 protected:
  Rating rate(BufferId id, const BufferState& state, const EvictRequest& request) const override {
    const Rating r = OracleRulePolicy::rate(id, state, request);
    const UseSchedule::NextUse next = future_.nextUse(id, position_);
    seen.push_back({request.urgent, r.eligible, r.action, r.score, state.recompute_ns, state.bytes,
                    next.ns != kUnknownNs && next.reused});
    return r;
  }

 private:
  UseSchedule future_;
  std::uint32_t position_ = 0;
};

// The gated drop-based rules, on both shapes of random workload over several seeds, budgets and
// links: ahead of need no drop costs more than the gate's share of a round trip, and no swap
// takes a drop's place; the swaps of last resort score below every drop; the runs are sound.
TEST(OracleRules, GatedDropsAheadAndRankedLastResort) {
  int ahead_drops = 0, gated_out = 0, last_resort = 0;
  for (std::uint32_t seed = 1; seed <= 6; ++seed) {
    for (int shape = 0; shape < 2; ++shape) {
      std::mt19937 rng(seed * 104729u + static_cast<std::uint32_t>(shape));
      const Workload w = shape == 0 ? randomTraining(rng, 3 + static_cast<int>(seed % 4))
                                    : randomGraph(rng, 12 + static_cast<int>(seed % 3) * 4);
      ASSERT_EQ(w.validate(), "");
      for (double share : {0.5, 0.7}) {
        for (double gbps : {12.0, 50.0}) {
          SimOptions o;
          o.budget_bytes = static_cast<std::uint64_t>(share * static_cast<double>(w.peakBytes()));
          o.h2d_gbps = o.d2h_gbps = gbps;
          for (double gate : {1.0, 1.0 / 16}) {
            for (auto window : {Prefetcher::Window::kGross, Prefetcher::Window::kNet}) {
              OracleRule rule{OracleRule::Actions::kDropOnly, OracleRule::Rank::kCost, window, 1.0, true};
              rule.swap_ahead = false;
              rule.ahead_gate = gate;
              rule.rank_last_resort = true;
              rule.plain_drop_price = true;  // the price is the hook's cost: checkable here
              SCOPED_TRACE("seed " + std::to_string(seed) + " shape " + std::to_string(shape) + " " + rule.name());
              RatingSpy spy(policyConfigFor(w, o), w, rule);
              Simulator sim(w, o);
              const SimResult r = sim.run(spy);
              EXPECT_EQ(r.used_while_evicted, 0u);
              const double round_trip_per_byte = 1.0 / gbps + 1.0 / gbps;  // ns per byte, both ways
              for (const RatingSpy::Seen& s : spy.seen) {
                if (!s.urgent && s.eligible) {
                  EXPECT_EQ(s.action, Action::kRecompute) << "a swap ahead in place of a drop";
                  if (s.action == Action::kRecompute && s.reused) {
                    ++ahead_drops;
                    // A drop's price is at most its hook's cost (0 when freed before its use).
                    EXPECT_LE(static_cast<double>(s.recompute_ns),
                              gate * round_trip_per_byte * static_cast<double>(s.bytes) + 2.0)
                        << "a drop ahead above the gate";
                  }
                }
                if (!s.urgent && !s.eligible && s.reused && s.recompute_ns != kUnknownNs &&
                    static_cast<double>(s.recompute_ns) > gate * round_trip_per_byte * static_cast<double>(s.bytes)) {
                  ++gated_out;
                }
                if (s.eligible && s.action == Action::kSwap) {
                  ++last_resort;
                  EXPECT_LT(s.score, 0.0) << "a swap of last resort ranked with the drops";
                }
                if (s.eligible && s.action == Action::kRecompute) {
                  EXPECT_GT(s.score, 0.0);
                }
              }
            }
          }
        }
      }
    }
  }
  // The cases exercise what is checked.
  EXPECT_GT(ahead_drops, 0);
  EXPECT_GT(gated_out, 0);
  EXPECT_GT(last_resort, 0);
}

// Rule names tell every rule apart (replay prints them; sweep's plan column shows the one kept),
// and the gated rules are among those the oracle replays.
TEST(OracleRules, NamesAreDistinct) {
  const std::vector<OracleRule> rules = oracleRules();
  std::vector<std::string> names;
  for (const OracleRule& r : rules) names.push_back(r.name());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "drop-only/cost/net/no-swap-ahead/gate-0.0625/ranked-swaps"),
            names.end());
}

// runOffsets: the timing a run produced, one entry per op and the iteration's length; with
// unlimited memory it is the compute-only timing the future starts from.
TEST(OracleRules, RunOffsetsAreTheRunsTiming) {
  for (std::uint32_t seed = 1; seed <= 4; ++seed) {
    for (int shape = 0; shape < 2; ++shape) {
      std::mt19937 rng(seed * 31337u + static_cast<std::uint32_t>(shape));
      const Workload w = shape == 0 ? randomTraining(rng, 4) : randomGraph(rng, 14);
      SCOPED_TRACE("seed " + std::to_string(seed) + " shape " + std::to_string(shape));
      const UseSchedule future = w.schedule();
      for (double share : {10.0, 0.5}) {  // unlimited, then half the peak
        SimOptions o;
        o.budget_bytes = static_cast<std::uint64_t>(share * static_cast<double>(w.peakBytes()));
        OracleRulePolicy p(policyConfigFor(w, o), w, OracleRule{});
        Simulator sim(w, o);
        sim.run(p);
        const std::vector<std::int64_t> offsets = p.runOffsets();
        ASSERT_EQ(offsets.size(), w.ops.size() + 1);
        for (std::size_t i = 0; i < w.ops.size(); ++i) {
          EXPECT_LE(offsets[i] + w.ops[i].compute_ns, offsets[i + 1]) << "op " << i;
          if (share > 1) {
            EXPECT_EQ(offsets[i], future.offsetNs(static_cast<std::uint32_t>(i))) << "op " << i;
          }
        }
        if (share > 1) {
          EXPECT_EQ(offsets.back(), future.durationNs());
        }
      }
    }
  }
}

// Retimed and vetoed candidates are plans like the others: the same inputs give the same run,
// and vetoing every buffer the run evicted keeps it in budget (a veto only orders: a vetoed
// buffer still goes when nothing else can), with the evictions' prices dearest first.
TEST(OracleRules, RetimedAndVetoedRunsAreDeterministicAndInBudget) {
  for (std::uint32_t seed = 1; seed <= 5; ++seed) {
    for (int shape = 0; shape < 2; ++shape) {
      std::mt19937 rng(seed * 7u + static_cast<std::uint32_t>(shape));
      const Workload w = shape == 0 ? randomTraining(rng, 3 + static_cast<int>(seed % 3)) : randomGraph(rng, 16);
      for (double gbps : {12.0, 50.0}) {
        SCOPED_TRACE("seed " + std::to_string(seed) + " shape " + std::to_string(shape) + " " + std::to_string(gbps));
        SimOptions o;
        o.budget_bytes = w.peakBytes() / 2;
        o.h2d_gbps = o.d2h_gbps = gbps;
        for (const OracleRule& rule : {OracleRule{}, OracleRule{OracleRule::Actions::kDropOnly, OracleRule::Rank::kCost,
                                                                Prefetcher::Window::kNet, 1.0, true}}) {
          OracleRulePolicy base(policyConfigFor(w, o), w, rule);
          const SimResult r0 = Simulator(w, o).run(base);
          const std::vector<std::int64_t> offsets = base.runOffsets();
          const auto prices = base.evictionPrices();
          for (std::size_t i = 1; i < prices.size(); ++i) EXPECT_GE(prices[i - 1].first, prices[i].first);
          std::vector<BufferId> vetoed;
          for (const auto& [price, id] : prices) vetoed.push_back(id);
          OracleRulePolicy a(policyConfigFor(w, o), w, rule, offsets, vetoed);
          OracleRulePolicy b(policyConfigFor(w, o), w, rule, offsets, vetoed);
          const SimResult ra = Simulator(w, o).run(a);
          const SimResult rb = Simulator(w, o).run(b);
          EXPECT_EQ(ra.total_ns, rb.total_ns);
          EXPECT_EQ(ra.used_while_evicted, 0u);
          if (r0.over_budget_ops == 0) {
            EXPECT_EQ(ra.over_budget_ops, 0u) << rule.name();
          }
        }
      }
    }
  }
}

// The oracle's outer replay reproduces the candidate it chose, retimed and vetoed ones
// included, over seeds, shapes, budgets and links; the chosen one is never slower than any
// candidate that kept the budget.
TEST(Oracle, ReplaysItsBestCandidateEverywhere) {
  int refined = 0;
  for (std::uint32_t seed = 1; seed <= 4; ++seed) {
    for (int shape = 0; shape < 2; ++shape) {
      std::mt19937 rng(seed * 65537u + static_cast<std::uint32_t>(shape));
      const Workload w = shape == 0 ? randomTraining(rng, 4 + static_cast<int>(seed % 2)) : randomGraph(rng, 14);
      for (double share : {0.5, 0.7}) {
        for (double gbps : {12.0, 50.0}) {
          SCOPED_TRACE("seed " + std::to_string(seed) + " shape " + std::to_string(shape));
          const OracleRun run = runOracle(w, optionsAt(w, share, gbps));
          const OracleChoice& oracle = run.choice();
          const SimResult& r = run.result;
          std::int64_t best = -1;
          for (const OracleCandidate& c : oracle.candidates()) {
            if (c.result.gave_up || c.result.over_budget_ops > 0) continue;
            if (best < 0 || c.result.total_ns < best) best = c.result.total_ns;
          }
          if (best >= 0) {
            EXPECT_EQ(r.total_ns, best);
          }
          refined += oracle.planName().find("/retimed-") != std::string::npos ||
                     oracle.planName().find("/vetoed-") != std::string::npos;
        }
      }
    }
  }
  std::printf("the oracle kept a retimed or vetoed candidate on %d of 32 cases\n", refined);
}

// The planners' starts: each is the run of its policy (delta, swap-only, recompute-only) as the
// replay has it, exactly (never cut short: a planner's learning iteration can be far slower than
// the rules' runs while its measured ones are faster); so the oracle is never slower than any of
// them that keeps the budget. Over seeds, shapes, budgets and links, with the iterations a sweep
// runs.
TEST(Oracle, ItsPlannersStartsAreThePoliciesRunsAndBoundThem) {
  int planned_chosen = 0, vetoed_further = 0, cases = 0;
  for (std::uint32_t seed = 1; seed <= 4; ++seed) {
    for (int shape = 0; shape < 2; ++shape) {
      std::mt19937 rng(seed * 104729u + static_cast<std::uint32_t>(shape));
      const Workload w = shape == 0 ? randomTraining(rng, 4 + static_cast<int>(seed % 3)) : randomGraph(rng, 18);
      for (double share : {0.4, 0.6}) {
        for (double gbps : {12.0, 50.0}) {
          SCOPED_TRACE("seed " + std::to_string(seed) + " shape " + std::to_string(shape) + " " +
                       std::to_string(share) + " " + std::to_string(gbps));
          const SimOptions o = optionsAt(w, share, gbps);
          const OracleRun run = runOracle(w, o);
          const OracleChoice& oracle = run.choice();
          const SimResult& best = run.result;
          ++cases;
          planned_chosen += oracle.chosen().planned;
          vetoed_further += oracle.chosen().planned && !oracle.chosen().vetoed.empty();
          const std::pair<std::string_view, DirectorMode> variants[] = {
              {"delta", DirectorMode::kMixed}, {"swap-only", DirectorMode::kSwapOnly},
              {"recompute-only", DirectorMode::kRecomputeOnly}};
          for (const auto& [name, mode] : variants) {
            const SimResult r = replay(w, name, o);
            const OracleCandidate* start = nullptr;
            for (const OracleCandidate& c : oracle.candidates()) {
              if (c.planned && c.configured == mode && c.vetoed.empty()) start = &c;
            }
            ASSERT_NE(start, nullptr) << name;
            EXPECT_FALSE(start->result.gave_up) << name;
            EXPECT_EQ(start->result.total_ns, r.total_ns) << name;
            EXPECT_EQ(start->result.run_ns, r.run_ns) << name;
            EXPECT_EQ(start->result.over_budget_ops, r.over_budget_ops) << name;
            if (r.over_budget_ops == 0) {
              EXPECT_EQ(best.over_budget_ops, 0u) << name;
              EXPECT_LE(best.total_ns, r.total_ns) << name;
            }
          }
        }
      }
    }
  }
  std::printf("a planner's start chosen on %d of %d cases, vetoed further on %d\n", planned_chosen, cases,
              vetoed_further);
}

// The oracle against every other policy and, with CBC, against the exact bound; returns the
// oracle's gaps to the bound where both are in budget. `what` names the case set.
std::vector<double> againstTheBoundAndEveryPolicy(const std::vector<Case>& set, const char* what) {
  const std::vector<std::string_view> others = {"delta", "lru", "dtr", "swap-only", "recompute-only", "belady"};
  std::vector<double> gaps;
  int unsolved = 0, infeasible = 0;
  for (const Case& c : set) {
    SCOPED_TRACE(c.label);
    const SimResult oracle = replay(c.workload, "oracle", c.options);
    for (std::string_view name : others) {
      const SimResult r = replay(c.workload, name, c.options);
      if (r.over_budget_ops > 0) continue;
      EXPECT_EQ(oracle.over_budget_ops, 0u) << name << " keeps the budget";
      EXPECT_LE(oracle.total_ns, r.total_ns) << name;
    }
    if (!tools::haveExactSolver()) continue;
    const tools::ExactBound bound =
        tools::exactBound(c.workload, c.options.budget_bytes, c.options.h2d_gbps, c.options.d2h_gbps);
    if (!bound.solved) {
      ++unsolved;
      continue;
    }
    if (!bound.feasible) {
      ++infeasible;
      continue;
    }
    EXPECT_EQ(oracle.over_budget_ops, 0u) << "the bound says a plan fits";
    // The bound is a lower bound of every in-budget run (1 ns per op of solver tolerance).
    EXPECT_GE(static_cast<double>(oracle.total_ns), bound.lower_ns - static_cast<double>(c.workload.ops.size()))
        << "bound " << bound.lower_ns;
    if (oracle.over_budget_ops == 0 && bound.lower_ns > 0) {
      gaps.push_back(static_cast<double>(oracle.total_ns) / bound.lower_ns - 1.0);
    }
  }
  if (gaps.empty()) return gaps;
  std::sort(gaps.begin(), gaps.end());
  auto at = [&](double q) { return 100.0 * gaps[static_cast<std::size_t>(q * static_cast<double>(gaps.size() - 1))]; };
  std::printf("oracle gap to the exact bound over %zu workloads%s (%d unsolved, %d with no plan in budget): "
              "median %.2f %%, p90 %.2f %%, worst %.2f %%, at 0: %td\n",
              gaps.size(), what, unsolved, infeasible, at(0.5), at(0.9), at(1.0),
              std::count_if(gaps.begin(), gaps.end(), [](double g) { return g < 1e-6; }));
  return gaps;
}

TEST(Oracle, AgainstTheExactBoundAndEveryPolicy) {
  const std::vector<double> gaps = againstTheBoundAndEveryPolicy(cases(), "");
  if (!tools::haveExactSolver()) GTEST_SKIP() << "built without CBC: the bound was not checked";
  ASSERT_FALSE(gaps.empty());
}

// Buffers that take more memory than their copies move (a mapping rounded up to whole
// granules, as --as-played has them): the oracle and the bound price the copies by what they
// move, as the simulator runs them, and the bound stays below every run.
TEST(Oracle, AgainstTheExactBoundWhenCopiesMoveLessThanTheMemory) {
  std::vector<Case> set;
  for (Case& c : cases()) {
    if (c.options.h2d_gbps != 12.0 || c.label.find(" 90%") != std::string::npos) continue;
    std::mt19937 rng(static_cast<std::uint32_t>(set.size()) + 1);
    std::uniform_int_distribution<int> eighths(2, 7);
    for (WorkloadBuffer& b : c.workload.buffers) b.copy_bytes = b.bytes / 8 * static_cast<std::uint64_t>(eighths(rng));
    c.label += " copies of 2/8 to 7/8";
    set.push_back(std::move(c));
  }
  const std::vector<double> gaps = againstTheBoundAndEveryPolicy(set, " whose copies move less than their memory");
  if (!tools::haveExactSolver()) GTEST_SKIP() << "built without CBC: the bound was not checked";
  ASSERT_FALSE(gaps.empty());
}

}  // namespace
}  // namespace delta::policy
