// The `oracle` bound, for the simulator only. It is handed the whole workload (every use, every
// producer and recompute cost) and the replay's options, and at each eviction chooses victims
// and swap or drop for each by what each would cost from here on, knowing when the buffer is
// next used, when the copy engines free up, and what its recompute would need (its producer's
// time plus whatever of the producer's inputs is evicted at that moment: restored, or
// recomputed in turn).
//
// One rule (OracleRule) fixes how costs are weighed; no single weighing is best on every
// workload and link, so `oracle` replays a fixed set of rules through the simulator before the
// run, improves on the best ones (retimed by their own runs, the gate's share searched, the
// dearest evictions vetoed) and keeps the candidate with the fewest ops over budget, then the
// shortest time. Three more starts are delta's planner on the same workload: the runs of delta,
// swap-only and recompute-only, which learn the iteration the replay repeats exactly and replay
// their candidates on it; the best is vetoed further by the waits its run measured
// (OraclePlannedPolicy). Without them the rules were no bound: once delta's planner searched
// vetoes of its own, delta beat them on 225 and 212 of the regret benchmark's 600 rows, and
// recompute-only on 13 and 27 (docs/policy.md, *The oracle*).
// It is a heuristic upper bound on the best plan, checked against an exact lower bound on small
// workloads (tests/policy/oracle_test.cpp, tools/exact_bound.h).
//
// Offline: makeOracle replays the workload (milliseconds to seconds); the calls after it follow
// the hot-path contract of policy.h.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "policy/delta_policy.h"
#include "policy/planner.h"
#include "policy/policy.h"
#include "policy/prefetcher.h"
#include "policy/simulator.h"
#include "policy/use_schedule.h"
#include "policy/workload.h"

namespace delta::policy {

// How one candidate plan weighs its choices.
struct OracleRule {
  enum class Actions : std::uint8_t {
    kMixed,      // per victim the cheaper of swap and drop
    kSwapOnly,   // always swap
    kDropFirst,  // drop what a recompute can regenerate, swap the rest
    kDropOnly,   // drop what a recompute can regenerate; swap only when that does not suffice
  };
  enum class Rank : std::uint8_t {
    kFarthest,  // farthest next use first (Belady's order), whatever it costs
    kCost,      // most bytes x time-until-next-use per ns the action costs
  };
  Actions actions = Actions::kMixed;
  Rank rank = Rank::kCost;
  Prefetcher::Window window = Prefetcher::Window::kGross;  // room made ahead (prefetcher.h)
  // A swap's price times this: > 1 where restores cannot start as soon as the copy out ends
  // (they wait for free memory), so a swap that looks hidden is not.
  double swap_weight = 1.0;
  // Whether a drop's freed bytes are counted net of the inputs its recompute keeps alive.
  bool net_of_held = true;
  // drop-only: whether a buffer no recompute can regenerate may be swapped when room is made
  // ahead (false: only when memory is needed now, after every drop).
  bool swap_ahead = true;
  // Ahead of need, only drops whose recompute costs at most this share of a round trip of the
  // buffer over the links (0: every drop); the others wait for a request that needs the memory.
  double ahead_gate = 0;
  // drop-only: the swaps of last resort ranked by their own score (false: all alike, by id).
  bool rank_last_resort = false;
  // A drop priced at its producer's time alone (false: plus the evicted inputs it would need).
  bool plain_drop_price = false;
  // Room made ahead never evicts a buffer used within the whole window (false: only one used
  // before the memory is needed, the window's peak; one used after it may go).
  bool protect_window = true;
  // The window as it was before a launch's own bytes counted in its test (Prefetcher's
  // short_window): shorter, less room ahead. b5707ec lengthened the window for delta; with the
  // longer one alone the oracle lost ResNet-32 at 30 %/50 GB/s to delta (11.33 -> 17.74 %).
  bool short_window = false;

  std::string name() const;  // e.g. "mixed/cost/net"
};

// The rules `oracle` replays, in order (ties go to the first).
std::vector<OracleRule> oracleRules();

// One rule, applied with the future: the candidate plans `oracle` chooses among.
class OracleRulePolicy : public Policy {
 public:
  // `workload` must outlive the policy; `future` is workload.schedule().
  // `offsets_ns` (ops + 1 entries, the iteration's length last), when given, times the future
  // as a run has timed it (runOffsets) instead of by compute alone.
  // `vetoed`: buffers evicted only when nothing else is left (the oracle's local search).
  OracleRulePolicy(const PolicyConfig& config, const Workload& workload, OracleRule rule,
                   std::span<const std::int64_t> offsets_ns = {}, std::span<const BufferId> vetoed = {});
  // When each op started in the last whole iteration of the run, from the iteration's start,
  // and that iteration's length (ops + 1 entries; empty before an iteration was run whole).
  std::vector<std::int64_t> runOffsets() const;
  // The buffers evicted in the last whole iteration, each with the highest price it was chosen
  // at (its recompute, or the visible part of its swap), dearest first.
  std::vector<std::pair<double, BufferId>> evictionPrices() const;

  std::string_view name() const override { return "oracle"; }
  void onLaunch(const Launch& launch) override;
  void onIteration(std::int64_t now_ns) override;
  std::size_t choosePrefetches(const PrefetchRequest& request, std::span<Prefetch> out) override;
  std::uint64_t upcomingBytes(std::int64_t now_ns, std::int64_t& need_at_ns) const override;

  const OracleRule& rule() const { return rule_; }

 protected:
  Rating rate(BufferId id, const BufferState& state, const EvictRequest& request) const override;
  double rankKey(BufferId id, const BufferState& state) const override;
  void noteChoice(BufferId id, const BufferState& state, Action action) const override;

 private:
  // Time a recompute of `id` would take now: its producer's time plus the producer's evicted
  // inputs (restored: their transfer; dropped: their own recompute, `depth` levels down).
  double recomputeNs(BufferId id, int depth) const;
  // Bytes a drop of `id` keeps alive: its producer's inputs that the program frees before the
  // next use of `id` (the simulator holds them for the recompute).
  std::uint64_t heldBytes(BufferId id) const;

  const Workload& workload_;
  std::vector<std::uint32_t> free_op_;  // per buffer: the op after which it is freed (or kNoPos)
  UseSchedule future_;
  OracleRule rule_;
  std::uint32_t position_ = 0;
  std::vector<std::int64_t> starts_;       // per op: when it started in the current iteration
  std::vector<std::int64_t> last_offsets_;  // the last whole iteration's (runOffsets)
  std::int64_t iteration_start_ = -1;
  std::vector<std::uint8_t> vetoed_;    // per buffer: evicted last
  mutable std::vector<double> price_;   // per buffer: the price it was chosen at this iteration
  std::vector<double> last_price_;      // the same for the last whole iteration
  mutable double rated_price_ = 0;      // the last candidate rated (chosen ones are rated last)
};

// One candidate of the oracle's search and its replay (a candidate cut short has gave_up set).
struct OracleCandidate {
  OracleRule rule;
  SimResult result;
  int retimed = 0;  // rounds of retiming behind it (0: timed by compute alone)
  std::vector<std::int64_t> offsets_ns;  // the timing it ran with (empty: compute alone)
  std::vector<BufferId> vetoed;          // evicted last (the local search's moves kept)
  // A planner's start instead of a rule: the run of delta (or of its variant `configured`), its
  // plan as that run made it (`plan`), with `vetoed` added to the plan's own vetoes (adopted
  // once learned; none: the policy as it runs).
  bool planned = false;
  DirectorMode configured = DirectorMode::kMixed;
  Plan plan;
  // The rule's, "/retimed-N", "/vetoed-N"; a planner's start: the policy's name, ":", the plan's
  // (Plan::name), "/+vetoed-N" for the vetoes added.
  std::string name() const;
};

// What the oracle's search found, and the candidate kept (the fewest ops over budget, then the
// shortest time; ties: the first).
struct OracleSearch {
  std::size_t best = 0;
  std::vector<OracleCandidate> candidates;
};

// `oracle`: replays every rule of oracleRules() on `workload` under `options`, then improves on
// the best: (1) retiming: the best few rules are replayed again with the future timed as their
// own run went, three rounds (the waits a plan causes stretch the time to every next use, and a
// plan priced on compute alone restores too early and evicts too much: synthetic attention at
// 30 %, 833 % -> 340 %); (2) when the best run is gated, a line search on the gate's share;
// (3) local search: the dearest evictions of the best run so far are vetoed one at a time
// (evicted only when nothing else is left), each kept if the run is faster. Then the planners'
// starts: the runs of delta, swap-only and recompute-only, and from the fastest of them the
// buffers its run waited for longest vetoed in turn on top of its plan's, each kept if the run
// is faster.
OracleSearch searchOracle(const PolicyConfig& config, const Workload& workload, const SimOptions& options);

// The policy that runs the best candidate of searchOracle (the outer replay with the same
// options reproduces its run exactly): an OraclePolicy or an OraclePlannedPolicy.
std::unique_ptr<Policy> makeOracle(const PolicyConfig& config, const Workload& workload, const SimOptions& options);

// What either kind of oracle reports of its search.
class OracleChoice {
 public:
  using Candidate = OracleCandidate;
  // Every candidate's replay, the chosen one among them.
  const std::vector<OracleCandidate>& candidates() const { return candidates_; }
  const OracleCandidate& chosen() const { return candidates_[best_]; }
  std::string planName() const { return chosen().name(); }

 protected:
  explicit OracleChoice(OracleSearch found) : candidates_(std::move(found.candidates)), best_(found.best) {}
  ~OracleChoice() = default;

 private:
  std::vector<OracleCandidate> candidates_;
  std::size_t best_;
};

// The oracle when a rule's candidate is best.
class OraclePolicy : public OracleRulePolicy, public OracleChoice {
 public:
  // `found.candidates[found.best]` must be a rule's (not planned).
  OraclePolicy(const PolicyConfig& config, const Workload& workload, OracleSearch found);
  std::string_view name() const override { return "oracle"; }
};

// The oracle when a planner's start is best: delta (or its variant), adopting the plan found
// (its own and the oracle's vetoes) once it has learned the iteration, as it adopts its
// planner's.
class OraclePlannedPolicy : public DeltaPolicy, public OracleChoice {
 public:
  OraclePlannedPolicy(const PolicyConfig& config, OracleSearch found);
  std::string_view name() const override { return "oracle"; }
};

}  // namespace delta::policy
