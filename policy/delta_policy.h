// The `delta` policy (and its `swap-only` / `recompute-only` variants): the paper's filter,
// director and prefetcher, driven by the iteration pattern it learns online.
//
// Candidates are ranked by predicted next use (farthest first; before the pattern is known, or
// for a buffer it does not cover, one iteration after the last use, which is LRU order), kept up
// to date on each use. The policy also keeps a ledger of the link time it owes: the restore time
// of every buffer it swapped out and has not brought back, plus those chosen earlier in the same
// request; the director charges a swap for the part of its restore that this load leaves
// visible (director.h). It also learns what its actions really cost from the waits the caller
// reports (onWaited): per swap context and for recomputes, the time launches waited against
// the naive cost; a swap is charged at least its measured share of the transfer and a
// recompute its measured factor. Two rules keep evictions ahead of need (urgent == false)
// from hurting: none that costs more per byte than the on-demand evictions have lately, and
// none of a buffer brought back for a use still to come. With a budget (PolicyConfig), each
// newly learned iteration is planned (planner.h): the mode and the window of upcomingBytes
// that a replay of the iteration finds fastest; a new mode, or the mode and window kept,
// start from the times and the measured costs its replay had reached. The plan is then checked
// against the run, once per iteration: a candidate whose iterations wait clearly longer than
// another candidate is predicted (or was measured) to is left for that one (checkPlan), a few
// times at most, and the plan's vetoes (Plan::vetoed) are dropped where the run is clearly
// slower with them than predicted without. Costs as in policy.h; learning adds O(buffers of the
// launch) per launch, and a newly learned iteration re-ranks the resident buffers once
// (O(n log n)); the outcome bookkeeping is O(1) per event, the check O(candidates) per
// iteration, adopting a plan O(its vetoes and the last plan's).
#pragma once

#include <string_view>
#include <utility>
#include <vector>

#include "policy/access_pattern.h"
#include "policy/director.h"
#include "policy/planner.h"
#include "policy/prefetcher.h"
#include "policy/policy.h"

namespace delta::policy {

class DeltaPolicy : public Policy {
 public:
  DeltaPolicy(const PolicyConfig& config, DirectorMode mode);
  // Its whole state, to run on from where this one is in two ways: the planner's replays share
  // the iteration they learn before they switch (Simulator::resume). O(buffers + learned uses).
  DeltaPolicy(const DeltaPolicy&) = default;

  std::string_view name() const override;
  void onAlloc(BufferId id, std::uint64_t bytes, std::int64_t now_ns) override;
  void onFree(BufferId id, std::int64_t now_ns) override;
  void onLaunch(const Launch& launch) override;
  void onIteration(std::int64_t now_ns) override;
  void onWaited(BufferId id, std::int64_t waited_ns) override;
  // The learned iteration is timed by the device once an iteration's launches are reported
  // (AccessPattern::onLaunchTimed); every rank changes then (once per iteration timed).
  void onLaunchTimed(std::uint64_t launch, std::int64_t device_start_ns, std::int64_t device_end_ns,
                     bool gap_is_waits = true) override;
  bool wantsLaunchTimes() const override { return config_.timed_launches; }
  std::size_t choosePrefetches(const PrefetchRequest& request, std::span<Prefetch> out) override;
  std::uint64_t upcomingBytes(std::int64_t now_ns, std::int64_t& need_at_ns) const override;
  // With PolicyConfig::plan_elsewhere (policy.h): a newly learned iteration becomes a request
  // (copied into storage reserved at construction) instead of a plan on the spot; a delivered
  // plan is adopted at the next iteration boundary, as the synchronous planner's is at the
  // boundary that learned it. While a request is out, an iteration learned meanwhile is
  // requested at the first boundary after the delivery.
  const PlanRequest* takePlanRequest() override;
  void deliverPlan(Plan&& plan) override;
  // Plans adopted so far (each by replan or at a boundary).
  std::uint32_t plansAdopted() const { return plans_adopted_; }
  // Candidates of the adopted plan switched to since it was adopted, because the run waited
  // longer per iteration than another candidate's replay predicted (checkPlan).
  std::uint32_t planSwitches() const override { return plan_switches_; }
  std::string runningPlan() const override;
  std::uint32_t iterationBoundaries() const override { return pattern_.boundaries(); }

  const AccessPattern& pattern() const { return pattern_; }
  // The mode and window chosen for the learned iteration (planner.h); the configured mode and
  // the gross window until planned.
  const Plan& plan() const { return plan_; }
  DirectorMode activeMode() const { return plan_.planned ? plan_.mode : mode_; }
  Prefetcher::Window activeWindow() const { return plan_.planned ? plan_.window : Prefetcher::Window::kGross; }
  // For the planner's replays: run in the configured mode until an iteration is learned, then
  // `mode` and `window`, as a planned policy would (without planning in turn).
  // `optimistic`: Plan::optimistic for the mode switched to.
  // `vetoed`: Plan::vetoed.
  void switchWhenLearned(DirectorMode mode, Prefetcher::Window window = Prefetcher::Window::kGross,
                         bool optimistic = false, std::vector<BufferId> vetoed = {}) {
    switch_plan_ = Plan{};
    switch_plan_.planned = true;
    switch_plan_.mode = mode;
    switch_plan_.window = window;
    switch_plan_.optimistic = optimistic;
    switch_plan_.vetoed = std::move(vetoed);
    switch_adopts_ = false;
    switch_pending_ = true;
  }
  // Whether a plan moving from `from_mode` and `from_window` to `to_mode` and `to_window` starts
  // where its replay's measured iteration started (applyPlan): a new mode, no change, or the
  // far window; a change of window alone learns the next iteration again.
  static bool adoptsReplayedState(DirectorMode from_mode, Prefetcher::Window from_window, DirectorMode to_mode,
                                  Prefetcher::Window to_window) {
    return to_mode != from_mode || to_window == from_window || to_window == Prefetcher::Window::kFar;
  }
  // For the planner's check of a candidate: once an iteration is learned, adopt `plan` as a
  // planned policy adopts the planner's (its learned times and measured costs included), so
  // that the replay runs what the run will.
  void adoptWhenLearned(const Plan& plan) {
    switch_plan_ = plan;
    switch_adopts_ = true;
    switch_pending_ = true;
  }
  // Host-to-device time of the restores owed for buffers swapped out and not yet restored.
  std::int64_t owedRestoreNs() const { return owed_ns_; }
  // Measured cost of each action relative to its naive estimate (onWaited): the time launches
  // waited for a swapped buffer (its copy out holding memory, its restore) per ns of its
  // one-way transfer (0: all hidden), and for a recompute per ns of the hook's time (1: just
  // the op; more: its inputs had to come back too; 1 until measured).
  // Swaps are measured per context (swapClass): whether the memory was needed at once, and how
  // far ahead of the transfer time the next use was predicted. A class not measured yet: 1 (the
  // restore not hidden), pessimism until shown otherwise; under an optimistic plan
  // (Plan::optimistic) 0, the director's model alone. (Taking the other classes' average
  // instead was measured: it keeps delta from ever trying the swaps that turn out cheap.)
  double swapVisibleShare(std::uint32_t swap_class) const {
    return swap_outcome_[swap_class].ratio(untriedSwapShare());
  }
  double untriedSwapShare() const {
    return plan_.planned && plan_.mode == DirectorMode::kMixed && plan_.optimistic ? 0.0 : 1.0;
  }
  static std::uint32_t swapClass(bool urgent, std::int64_t next_use_ns, std::int64_t h2d_ns);
  static constexpr std::uint32_t kSlackClasses = 4;
  static constexpr std::uint32_t kSwapClasses = 2 * kSlackClasses;
  static_assert(kSwapClasses == MeasuredOutcomes::kSwapClasses);
  double recomputeFactor() const { return recompute_outcome_.ratio(1.0); }
  // Everything above, as sums: for the planner, to hand a replay's measurements to the policy
  // that switches to the replayed mode.
  MeasuredOutcomes measuredOutcomes() const;

 protected:
  Rating rate(BufferId id, const BufferState& state, const EvictRequest& request) const override;
  double rankKey(BufferId id, const BufferState& state) const override;
  void beginChoice() const override { tentative_ns_ = 0; }
  void noteChoice(BufferId id, const BufferState& state, Action action) const override;
  void residencyChanged(BufferId id) override;
  void recomputableChanged(BufferId id) override;

 private:
  // Without a learned iteration, a buffer is expected back about this long after its last use.
  static constexpr std::int64_t kDefaultPeriodNs = 1'000'000'000;
  // Switches of candidate a plan allows (checkPlan): enough to try the few that the replays
  // put near the chosen one, few enough that a noisy run cannot cycle through them.
  static constexpr std::uint32_t kMaxPlanSwitches = 3;

  void relearnIfChanged();
  void retimedIfChanged();
  void replan();
  // Copies what the planner reads into request_ and raises plan_wanted_.
  void requestPlan();
  // requestPlan, or later when a request is out or a plan waits to be adopted.
  void askForPlan();
  // What each launch of the learned iteration waited before it ran, for the planner.
  void plannedWaits(std::vector<std::int64_t>& out) const;
  // At an iteration boundary (a no-op otherwise): adopts a delivered plan, or requests one deferred while the
  // last request was out.
  void atBoundary();
  // Makes `plan` the active one; `replayed`: it carries its chosen replay's learned times and
  // measured costs (Planner::choose), which a new mode starts from when it still describes
  // the learned iteration (`current`).
  void applyPlan(Plan&& plan, bool replayed, bool current);
  void adoptOutcomes(const MeasuredOutcomes& outcomes);
  // At a boundary: the iteration just run under the plan against the plan's predictions; a
  // candidate predicted (or measured) to wait clearly less is switched to.
  void checkPlan();
  // A candidate's predicted waits per iteration (its predicted time less the compute), the
  // better of its two starts that kept the budget, or with `with_vetoes` the plan's with its
  // vetoes for the candidate they were searched for (unless dropped); kNotMeasured when none did.
  std::int64_t predictedWaitsNs(DirectorMode mode, Prefetcher::Window window, bool with_vetoes = true) const;
  // Whether the plan's vetoes hold for a candidate (the one they were searched for, until
  // checkPlan drops them), and for the candidate running now.
  bool vetoesHoldFor(DirectorMode mode, Prefetcher::Window window) const {
    return !plan_.vetoed.empty() && !vetoes_dropped_ && mode == chosen_mode_ && window == chosen_window_;
  }
  bool vetoesApplied() const { return vetoesHoldFor(plan_.mode, plan_.window); }
  void checkRestores(const Launch& launch);
  void closeOutcome(BufferId id, bool used);
  std::int64_t periodNs() const;
  double recentLoadNs(std::int64_t now_ns) const;

  AccessPattern pattern_;
  Director director_;
  DirectorMode mode_;
  Plan plan_;
  // The candidate plan_ chose, while checkPlan may run another.
  DirectorMode chosen_mode_ = DirectorMode::kMixed;
  Prefetcher::Window chosen_window_ = Prefetcher::Window::kGross;
  bool vetoes_dropped_ = false;  // by checkPlan: the run was slower with them than predicted without
  Plan switch_plan_;  // for the planner's replays (switchWhenLearned, adoptWhenLearned)
  bool switch_adopts_ = false;
  bool switch_pending_ = false;
  bool relearning_ = false;
  // Planning by the caller: the request (reserved when plan_elsewhere), whether the caller
  // holds it, a plan it delivered and not yet adopted, a request deferred while one was out.
  PlanRequest request_;
  bool request_out_ = false;
  Plan delivered_;
  bool delivered_ready_ = false;
  std::uint32_t delivered_generation_ = 0;
  bool request_deferred_ = false;
  std::uint32_t boundaries_seen_ = 0;
  std::uint32_t plans_adopted_ = 0;
  // The plan checked against the run (checkPlan), from its adoption on: the waits each
  // candidate (mode and window) ran at per iteration, kNotMeasured until it ran; the waits
  // told since the last boundary and in the iteration before; the boundary the candidate
  // running now started at; switches made.
  static constexpr std::int64_t kNotMeasured = -1;
  std::int64_t ran_waits_ns_[3][Prefetcher::kWindows] = {{-1, -1, -1, -1}, {-1, -1, -1, -1}, {-1, -1, -1, -1}};
  double mode_misjudged_[3] = {1.0, 1.0, 1.0};  // per mode: the most a candidate's rate exceeded its prediction
  std::int64_t iteration_waits_ns_ = 0;
  std::int64_t previous_waits_ns_ = 0;
  std::uint32_t candidate_since_ = 0;
  std::uint32_t plan_switches_ = 0;
  std::uint32_t generation_ = 0;
  std::uint32_t device_timed_ = 0;  // pattern_.deviceTimed() when last re-ranked
  std::uint32_t timed_generation_ = 0;  // the last learned iteration the device has timed
  bool plan_after_timing_ = false;      // a plan waits for the learned iteration's device times
  std::uint32_t timings_of_generation_ = 0;  // device timings of the learned iteration so far
  // For the planner: each id's size and hook cost as it was when freed (the learned iteration
  // refers to buffers long gone), and what each launch of the iteration waited.
  std::vector<PlannedBuffer> planned_;
  std::vector<std::int64_t> waited_at_;  // per launch position; sized at construction
  std::int64_t waited_since_launch_ = 0;
  std::vector<std::int64_t> owed_by_;  // per buffer: its share of owed_ns_; sized at construction
  std::int64_t owed_ns_ = 0;
  // Per buffer: swapped out and not restored; and how many are: with none, there is nothing to
  // prefetch, and choosePrefetches skips its walk over the launches ahead (O(1) instead of up
  // to Prefetcher's 512 launches per call: most calls of a recompute-only plan).
  std::vector<std::uint8_t> swapped_;
  std::uint32_t swapped_count_ = 0;
  // Host-to-device time of the restores started over about the last iteration (an
  // exponentially decayed sum with the iteration's length as time constant), and when it was
  // last brought up to date.
  double recent_ns_ = 0;
  // What an action cost, measured (onWaited) against what it would cost naively, over about
  // the last iteration (sums decayed with the iteration's length as time constant, so large
  // buffers weigh by their size and every phase of the iteration counts). Prefetching needs
  // free memory and link time, and under a tight budget it often has neither; a recompute may
  // need its dropped inputs first. Models of both miss cases; the measurement does not, and
  // it follows the workload as it changes.
  struct Outcome {
    double waited_ns = 0;
    double expected_ns = 0;
    std::int64_t at_ns = 0;  // when the sums were last decayed
    void add(double waited, double expected, std::int64_t now_ns, std::int64_t period_ns);
    double ratio(double unknown) const { return expected_ns > 0 ? waited_ns / expected_ns : unknown; }
  };
  enum class Pending : std::uint8_t { kNone, kEvicted, kBack };
  // Per swap class: an average over all swaps mixes the forced, urgent ones (a buffer with no
  // hook, its copy out on the critical path) with those chosen ahead with time to spare, and
  // would price the second kind by the first (and the other way round).
  Outcome swap_outcome_[kSwapClasses];
  Outcome recompute_outcome_;
  std::vector<Pending> pending_;        // per buffer: evicted, or back and not yet used
  std::vector<std::int64_t> waited_;    // per buffer: waits reported since it came back
  std::vector<std::int64_t> expected_;  // per buffer: naive cost of the way it came back
  // Per buffer: the swap class it was last chosen in (set by the const noteChoice: recording
  // the context of a choice changes no ranking).
  mutable std::vector<std::uint8_t> swap_class_;
  std::int64_t recent_at_ns_ = 0;
  std::int64_t now_ns_ = 0;  // the latest launch's time
  mutable std::int64_t tentative_ns_ = 0;  // restores owed by victims chosen in this request
  // Cost per byte of the victims chosen when memory was needed at once (ns per byte, decayed
  // over about an iteration): the price an eviction ahead of time has to beat.
  mutable Outcome urgent_price_;
  mutable std::int64_t rated_cost_ns_ = 0;  // the last candidate rated, for noteChoice
  mutable bool rated_urgent_ = false;
  mutable std::uint32_t rated_class_ = 0;
};

}  // namespace delta::policy
