// The delta policy: see delta_policy.h.
#include "policy/delta_policy.h"

#include <cmath>
#include <limits>

#include "policy/filter.h"
#include "policy/prefetcher.h"

namespace delta::policy {

DeltaPolicy::DeltaPolicy(const PolicyConfig& config, DirectorMode mode)
    : Policy(config),
      pattern_(config.max_buffers, config.max_launches, config.max_uses, config.timed_launches),
      director_(mode),
      mode_(mode),
      planned_(config.budget_bytes > 0 ? config.max_buffers : 0),
      waited_at_(config.budget_bytes > 0 ? config.max_launches : 0, 0),
      owed_by_(config.max_buffers, 0),
      swapped_(config.max_buffers, 0),
      pending_(config.max_buffers, Pending::kNone),
      waited_(config.max_buffers, 0),
      expected_(config.max_buffers, 0),
      // A buffer the caller evicts on its own counts as evicted when memory was short, with no
      // predicted slack, until chooseVictims picks it in some other context.
      swap_class_(config.max_buffers, static_cast<std::uint8_t>(swapClass(true, kUnknownNs, 0))) {
  if (config.plan_elsewhere && config.budget_bytes > 0) {
    request_.schedule.reserve(config.max_buffers, config.max_launches, config.max_uses);
    request_.buffers.reserve(planned_.size());
    request_.waited_ns.reserve(waited_at_.size());
  }
}

std::string_view DeltaPolicy::name() const {
  switch (mode_) {
    case DirectorMode::kSwapOnly: return "swap-only";
    case DirectorMode::kRecomputeOnly: return "recompute-only";
    case DirectorMode::kMixed: break;
  }
  return "delta";
}

void DeltaPolicy::onAlloc(BufferId id, std::uint64_t bytes, std::int64_t now_ns) {
  if (table_.valid(id)) closeOutcome(id, false);  // an id reused without onFree: a new buffer
  if (id < planned_.size()) planned_[id] = {bytes, kUnknownNs, UseSchedule::kNoPos};
  pattern_.onAlloc(bytes);
  Policy::onAlloc(id, bytes, now_ns);
}

void DeltaPolicy::recomputableChanged(BufferId id) {
  if (id >= planned_.size()) return;
  PlannedBuffer& p = planned_[id];
  if (table_[id].recompute_ns != kUnknownNs) {
    p.recompute_ns = table_[id].recompute_ns;
    p.lost_at = UseSchedule::kNoPos;
  } else if (p.recompute_ns != kUnknownNs && p.lost_at == UseSchedule::kNoPos && pattern_.position() > 0) {
    p.lost_at = pattern_.position() - 1;  // written by the launch just reported
  }
}

void DeltaPolicy::onFree(BufferId id, std::int64_t now_ns) {
  pattern_.onFree(id, table_.valid(id) ? table_[id].bytes : 0);
  if (id < planned_.size()) planned_[id].bytes = table_[id].bytes;
  Policy::onFree(id, now_ns);
}

void DeltaPolicy::onLaunch(const Launch& launch) {
  // Learn first, so that the ranks computed for the launch's buffers see the position after it.
  now_ns_ = std::max(now_ns_, launch.now_ns);
  checkRestores(launch);
  pattern_.onLaunch(launch);
  relearnIfChanged();
  retimedIfChanged();
  atBoundary();
  // Recorded after planning: a boundary makes this launch position 0 of the new iteration,
  // and the plan reads the old one's.
  const std::uint32_t pos = pattern_.position() - 1;
  if (pos < waited_at_.size()) waited_at_[pos] = waited_since_launch_;
  waited_since_launch_ = 0;
  Policy::onLaunch(launch);
}

void DeltaPolicy::onWaited(BufferId id, std::int64_t waited_ns) {
  if (waited_ns > 0) {
    waited_since_launch_ += waited_ns;
    iteration_waits_ns_ += waited_ns;
  }
  if (table_.valid(id) && waited_ns > 0 && pending_[id] != Pending::kNone) waited_[id] += waited_ns;
}

void DeltaPolicy::closeOutcome(BufferId id, bool used) {
  if (pending_[id] == Pending::kNone) return;
  const bool swapped = table_[id].evicted_by == Action::kSwap;
  Outcome& o = swapped ? swap_outcome_[swap_class_[id]] : recompute_outcome_;
  // Not used since it came back: nothing was brought back for a use, so its waits count but
  // no transfer to compare them with (a restore thrown away, or a recompute). Not used and
  // never brought back (freed while swapped out): the one transfer it made, its copy out, is
  // what its waits (the copy holding memory) compare with. Compared with nothing, a workload
  // whose swaps are mostly of buffers never read again (an LSTM's) priced each swap at
  // hundreds of its transfers, and dropped buffers it then had to recompute.
  const bool only_copied_out = swapped && pending_[id] == Pending::kEvicted;
  o.add(static_cast<double>(waited_[id]), used || only_copied_out ? static_cast<double>(expected_[id]) : 0.0,
        now_ns_, periodNs());
  pending_[id] = Pending::kNone;
  waited_[id] = 0;
}

void DeltaPolicy::Outcome::add(double waited, double expected, std::int64_t now_ns, std::int64_t period_ns) {
  const double dt = static_cast<double>(std::max<std::int64_t>(0, now_ns - at_ns));
  const double keep = std::exp(-dt / static_cast<double>(std::max<std::int64_t>(period_ns, 1)));
  waited_ns = keep * waited_ns + waited;
  expected_ns = keep * expected_ns + expected;
  at_ns = std::max(at_ns, now_ns);
}

std::uint32_t DeltaPolicy::swapClass(bool urgent, std::int64_t next_use_ns, std::int64_t h2d_ns) {
  // Slack: the predicted next use in transfer times, by factors of 4 (< 2, < 8, < 32, more);
  // an unpredicted use counts as no slack.
  std::uint32_t slack = 0;
  if (next_use_ns != kUnknownNs) {
    for (std::int64_t bound = 2 * std::max<std::int64_t>(h2d_ns, 1); slack + 1 < kSlackClasses && next_use_ns >= bound;
         bound *= 4) {
      ++slack;
    }
  }
  return (urgent ? kSlackClasses : 0) + slack;
}

void DeltaPolicy::checkRestores(const Launch& launch) {
  // The first use after a buffer came back closes its outcome: what launches waited for it
  // (its copy out holding memory, its restore or recompute; 0 when all was hidden) against
  // the naive cost of its action.
  for (BufferId id : launch.buffers) {
    if (table_.valid(id) && pending_[id] == Pending::kBack) closeOutcome(id, true);
  }
}

void DeltaPolicy::onIteration(std::int64_t now_ns) {
  pattern_.onIteration(now_ns);
  relearnIfChanged();
  retimedIfChanged();
  atBoundary();
}

void DeltaPolicy::onLaunchTimed(std::uint64_t launch, std::int64_t device_start_ns, std::int64_t device_end_ns,
                                bool gap_is_waits) {
  pattern_.onLaunchTimed(launch, device_start_ns, device_end_ns, gap_is_waits);
  retimedIfChanged();
}

void DeltaPolicy::retimedIfChanged() {
  if (pattern_.deviceTimed() == device_timed_) return;
  device_timed_ = pattern_.deviceTimed();
  if (timed_generation_ != pattern_.generation()) timings_of_generation_ = 0;
  ++timings_of_generation_;
  timed_generation_ = pattern_.generation();
  reindexAll();
  // Planned on times the device reported for every launch, or on the second timing: the first
  // iteration learned often ran partly before memory was short, when no launch is marked, and
  // those launches keep the host's intervals, which in a program's first iteration hold its
  // setup (ResNet-32 at 70 %, 12 GB/s: 29-50 ms over the 292 its launches ran, and every
  // candidate predicted that much dearer). An iteration whose marks the host outran is never
  // reported in full (the LSTM's): its second timing is as good as any.
  if (plan_after_timing_ && (pattern_.deviceTimedInFull() || timings_of_generation_ >= 2)) {
    plan_after_timing_ = false;
    askForPlan();
  }
}

void DeltaPolicy::relearnIfChanged() {
  if (pattern_.generation() == generation_) return;
  generation_ = pattern_.generation();
  replan();
  reindexAll();  // every prediction changed: once per learned iteration
}

void DeltaPolicy::replan() {
  if (relearning_) {
    // The iteration just run in the planned mode, learned again for its times (its launches
    // repeat the one planned on): the plan stands.
    relearning_ = false;
    return;
  }
  if (switch_pending_) {  // a planner's replay: switch as planned, plan nothing
    switch_pending_ = false;
    applyPlan(std::move(switch_plan_), switch_adopts_, true);
    return;
  }
  if (config_.budget_bytes == 0) return;
  for (BufferId id = 0; id < table_.capacity(); ++id) {
    if (table_[id].residency != Residency::kFree) planned_[id].bytes = table_[id].bytes;
  }
  if (config_.plan_elsewhere) {
    // Timed by the host until the device's times come (AccessPattern::onLaunchTimed): a plan
    // made on the host's intervals replays another workload (docs/shim.md, Planning).
    if (config_.timed_launches && timed_generation_ != pattern_.generation()) {
      plan_after_timing_ = true;
      return;
    }
    askForPlan();
    return;
  }
  std::vector<std::int64_t> waits;
  plannedWaits(waits);
  std::vector<BufferId> source_ids;
  const Workload workload = Planner::workloadFrom(pattern_.schedule(), planned_, waits, &source_ids);
  Plan plan = Planner::choose(workload, config_.budget_bytes, costs_, mode_, source_ids);
  const bool replayed = plan.planned;
  applyPlan(std::move(plan), replayed, true);
}

void DeltaPolicy::plannedWaits(std::vector<std::int64_t>& out) const {
  // The device's own account of what each launch of the learned iteration waited for, where it
  // has one: the waits the policy is told of are estimates (a restore's modelled copy, a
  // recompute's expected time), and leave out copies out waited for and a host that fell
  // behind. Left in the op times, those made the learned ResNet-32 at 70 %, 12 GB/s, its first
  // iteration online, 406 ms long where its launches ran 292, 10.7 ms of it told: every
  // candidate was predicted 95 ms dearer than the replay predicts it, and the plan chosen ran
  // slower than none. Where the device's gap may hold work the policy never saw (launches on
  // small buffers: the LSTM's, taken for waits, had its plan predict 725 ms per iteration for
  // 770 ms of kernels) or was not reported, the waits told. In the replay the two are the
  // same (every wait is told, exactly). Fills storage reserved for the request: no
  // allocation.
  const std::span<const std::int64_t> device = pattern_.deviceWaits();
  if (device.empty()) {
    out.assign(waited_at_.begin(), waited_at_.end());
    return;
  }
  out.resize(device.size());
  for (std::size_t pos = 0; pos < device.size(); ++pos) {
    const std::int64_t told = pos < waited_at_.size() ? waited_at_[pos] : 0;
    out[pos] = device[pos] != AccessPattern::kWaitsUnknown ? device[pos] : told;
  }
}

void DeltaPolicy::askForPlan() {
  // The launches waited for are recorded from the next launch on, over the iteration just
  // learned: the copy is taken now or, while the caller still plans the last one, never for
  // this iteration (the next boundary requests the iteration learned by then). A plan
  // delivered and adopted at this very boundary comes first: the iteration just learned ran
  // the old way, and the adopted plan may have the next one learned again (applyPlan).
  if (request_out_ || delivered_ready_) {
    request_deferred_ = true;
  } else {
    requestPlan();
  }
}

void DeltaPolicy::requestPlan() {
  // Copy-assignment into the storage reserved at construction: no allocation.
  request_.schedule = pattern_.schedule();
  request_.buffers.assign(planned_.begin(), planned_.end());
  plannedWaits(request_.waited_ns);
  request_.budget_bytes = config_.budget_bytes;
  request_.costs = costs_;
  request_.configured = mode_;
  request_.generation = pattern_.generation();
  request_deferred_ = false;
  plan_wanted_ = true;
}

const PlanRequest* DeltaPolicy::takePlanRequest() {
  if (!plan_wanted_) return nullptr;
  plan_wanted_ = false;
  request_out_ = true;
  return &request_;
}

void DeltaPolicy::deliverPlan(Plan&& plan) {
  if (!request_out_) return;  // not asked for: ignored
  request_out_ = false;
  delivered_ = std::move(plan);
  delivered_generation_ = request_.generation;
  delivered_ready_ = true;
}

void DeltaPolicy::atBoundary() {
  if (pattern_.boundaries() == boundaries_seen_) return;
  boundaries_seen_ = pattern_.boundaries();
  if (delivered_ready_) {
    delivered_ready_ = false;
    // A plan for an iteration learned since (a loop that changes) still beats none; its
    // replay's times and costs describe another iteration, so the mode starts from its own.
    const bool current = delivered_generation_ == pattern_.generation();
    const bool replayed = delivered_.planned;
    applyPlan(std::move(delivered_), replayed, current);
    reindexAll();  // predictions follow the adopted mode's times
  }
  checkPlan();
  if (request_deferred_ && !request_out_) {
    // A plan adopted that learns the next iteration again stands on it, as on the spot.
    if (relearning_) {
      request_deferred_ = false;
    } else {
      requestPlan();
    }
  }
}

void DeltaPolicy::applyPlan(Plan&& plan, bool replayed, bool current) {
  const DirectorMode before = activeMode();
  const Prefetcher::Window window_before = activeWindow();
  if (plan.planned || replayed) ++plans_adopted_;
  plan_ = std::move(plan);
  chosen_mode_ = plan_.mode;
  chosen_window_ = plan_.window;
  vetoes_dropped_ = false;
  setVetoed(plan_.vetoed);
  for (auto& by_window : ran_waits_ns_) std::fill(std::begin(by_window), std::end(by_window), kNotMeasured);
  std::fill(std::begin(mode_misjudged_), std::end(mode_misjudged_), 1.0);
  candidate_since_ = pattern_.boundaries();
  plan_switches_ = 0;
  const bool changed = activeMode() != before || activeWindow() != window_before;
  if (changed) director_ = Director(activeMode());
  // A new mode: what delta measured and learned so far is how the old mode's actions cost and
  // timed the iteration, and priced by it the new mode's first iteration misjudges its own
  // (ResNet-32 at 70 %, 50 GB/s: swap-only after a mixed first iteration made no room ahead,
  // since evicting ahead looked dearer than the old mode's cheap urgent drops: 21 % overhead on
  // that iteration, none after). The planner's replay ran the new mode on this very iteration:
  // start where its measured iteration started, with its learned times and its measured costs.
  // So too when nothing changes: the replay ran on one iteration further the way delta goes on
  // running, and its costs were measured with the pattern known, where delta's own were
  // measured while learning it (tree-rnn-3 at 50 %, 12 GB/s: the first iteration after learning
  // 348 % then 106 %; adopting, 185 % then 106; on the 180-row sample, seeds 1-10 of each
  // family, docs/policy.md, summed overheads down at both links). Not on a change of window
  // alone: the replay's costs are of the other window's evictions, and adopting them was
  // measured worse (the sample at 12 GB/s; DenseNet-121). Except to the far window, which
  // makes room by times far ahead: learned again from an iteration run by the old window, they
  // were not the replay's, and the plan ran slower than predicted (the `swap-only` variant on
  // DenseNet-121 at 50 %/50 GB/s: swap-only/far predicted 373.83 ms per iteration against
  // 374.56 by the gross window, ran 9.06 % over against 5.14; adopting the replay's start,
  // 5.18).
  if (replayed && current && adoptsReplayedState(before, window_before, activeMode(), activeWindow()) &&
      pattern_.retimeLearned(plan_.learned_offsets_ns, plan_.learned_waits_ns)) {
    adoptOutcomes(plan_.outcomes);
    return;
  }
  if (!changed) return;
  // A new window, or a planner's replay switching: the learned times are those of the
  // iteration run the old way (its stalls, its recomputes), and the predictions of next uses
  // and of the room to make ahead follow them. Learn the next iteration again, the first run
  // the new way; the iteration after it is the one the planner's prediction is for.
  pattern_.relearnNext();
  relearning_ = true;
}

std::int64_t DeltaPolicy::predictedWaitsNs(DirectorMode mode, Prefetcher::Window window, bool with_vetoes) const {
  // The better of its two starts, in budget: the switch made now is neither, and the run
  // measures what it is.
  if (with_vetoes && vetoesHoldFor(mode, window)) {
    return std::max<std::int64_t>(0, plan_.vetoed_ns - plan_.compute_ns);
  }
  std::int64_t best = kNotMeasured;
  const int m = static_cast<int>(mode), w = static_cast<int>(window);
  for (int start = 0; start < 2; ++start) {
    const std::int64_t predicted = plan_.predicted_ns[start][m][w];
    if (predicted < 0 || plan_.over_budget_ops[start][m][w] > 0) continue;
    const std::int64_t waits = std::max<std::int64_t>(0, predicted - plan_.compute_ns);
    best = best == kNotMeasured ? waits : std::min(best, waits);
  }
  return best;
}

void DeltaPolicy::checkPlan() {
  const std::int64_t waits = iteration_waits_ns_;
  iteration_waits_ns_ = 0;
  // The first iteration a candidate runs is its switch (relearned, its room not yet made the
  // new way), as in its replay: not what it runs at. Afterwards the slower of the last two: a
  // candidate whose iterations alternate runs at its slow ones every other iteration, and one
  // that drifts slower from iteration to iteration is judged by where it is going.
  const std::uint32_t ran = pattern_.boundaries() - candidate_since_;
  const std::int64_t previous = previous_waits_ns_;
  previous_waits_ns_ = waits;
  if (!plan_.planned || plan_.compute_ns <= 0 || ran < 2) return;
  const std::int64_t rate = ran == 2 ? waits : std::max(waits, previous);
  const int mode = static_cast<int>(plan_.mode), window = static_cast<int>(plan_.window);
  ran_waits_ns_[mode][window] = rate;
  // How far the mode's replays misjudged it: its other candidates are likely misjudged alike
  // (the mixed ones alike drift: 6 layers at 12 GB/s, 60 %, each predicted to wait 42 ms per
  // iteration ran at 75, where recompute-only ran as predicted).
  const std::int64_t floor_ns = std::max<std::int64_t>(plan_.compute_ns / 50, 1);
  // Not while its vetoes hold: a run slower than the vetoes' prediction misjudged them, not the
  // mode (the candidate without them is weighed on its own prediction below).
  const std::int64_t predicted_waits = predictedWaitsNs(plan_.mode, plan_.window);
  if (predicted_waits != kNotMeasured && !vetoesApplied()) {
    mode_misjudged_[mode] = std::max(mode_misjudged_[mode], static_cast<double>(rate + floor_ns) /
                                                                static_cast<double>(predicted_waits + floor_ns));
  }
  // The planner's replays predict each candidate from one learned iteration, over three
  // iterations; a run goes on for thousands, and the state a candidate carries from one
  // iteration to the next can take it elsewhere (tree-rnn-4 at 50 %/12 GB/s: mixed/net,
  // predicted at 95.3 ms per iteration, 16.4 of them waits, ran 95.3 ms, then 159, 188, 170,
  // 176; swap-only, predicted at 119, was never tried). What the run measured of a candidate
  // replaces its prediction; a candidate never run keeps its prediction (the better of its two
  // starts), scaled by how far its mode's measured candidates fell short of theirs, and one
  // clearly faster than the running candidate's rate is switched to (there: swap-only/far
  // after the fourth iteration, 111-117 ms from the seventh on). Each switch goes to a
  // candidate expected to wait less than the rate measured, and at most kMaxPlanSwitches are
  // made: a run that keeps missing its predictions stops where it measured least.
  if (plan_switches_ >= kMaxPlanSwitches) return;
  // A prediction must beat the rate by a tenth (a replay's prediction is only that); a rate
  // measured, by a fiftieth of the compute (the same candidate measured twice differs little).
  const std::int64_t measured_margin = plan_.compute_ns / 50;
  const std::int64_t predicted_margin = std::max(rate / 10, measured_margin);
  std::int64_t best = 0;
  int best_mode = -1, best_window = -1;
  // The candidate chosen, without its vetoes: the veto search kept each for a faster replay of
  // two iterations, and a run can settle elsewhere from there (unet-3 at 50 %/50 GB/s: 2 % over
  // iterations 2 to 4, then 16 and 19 %; iterations 5 to 8 at 13.4 % with its vetoes kept,
  // 11.7 % with them dropped here after the sixth, 4.4 % in the eighth).
  bool drop_vetoes = false;
  if (vetoesApplied()) {
    const std::int64_t expected = predictedWaitsNs(plan_.mode, plan_.window, false);
    if (expected != kNotMeasured && expected < rate - predicted_margin) {
      best = expected;
      drop_vetoes = true;
    }
  }
  for (int m = 0; m < 3; ++m) {
    // A forced variant keeps its mode (the planner replayed it alone).
    if (mode_ != DirectorMode::kMixed && m != static_cast<int>(mode_)) continue;
    for (int w = 0; w < Prefetcher::kWindows; ++w) {
      if (m == mode && w == window) continue;
      std::int64_t expected = ran_waits_ns_[m][w];
      std::int64_t margin = measured_margin;
      if (expected == kNotMeasured) {
        margin = predicted_margin;
        expected = predictedWaitsNs(static_cast<DirectorMode>(m), static_cast<Prefetcher::Window>(w));
        if (expected != kNotMeasured) {
          expected = static_cast<std::int64_t>(static_cast<double>(expected) * std::max(1.0, mode_misjudged_[m]));
        }
      }
      if (expected != kNotMeasured && expected < rate - margin && ((best_mode < 0 && !drop_vetoes) || expected < best)) {
        best = expected;
        best_mode = m;
        best_window = w;
      }
    }
  }
  if (best_mode < 0 && !drop_vetoes) return;
  ++plan_switches_;
  candidate_since_ = pattern_.boundaries();
  if (best_mode < 0) {  // the same candidate, its vetoes dropped for good
    vetoes_dropped_ = true;
    setVetoed({});
    return;
  }
  const bool new_mode = best_mode != mode;
  plan_.mode = static_cast<DirectorMode>(best_mode);
  plan_.window = static_cast<Prefetcher::Window>(best_window);
  plan_.start = PlanStart::kSwitched;
  // The vetoes were searched for the candidate chosen, and hold only there.
  setVetoed(vetoesApplied() ? std::span<const BufferId>(plan_.vetoed) : std::span<const BufferId>());
  if (new_mode) director_ = Director(plan_.mode);
  // As a planned switch does (applyPlan): the learned times are the old candidate's.
  pattern_.relearnNext();
  relearning_ = true;
  reindexAll();
}

std::string DeltaPolicy::runningPlan() const {
  if (!plan_.planned) return {};
  if (vetoesApplied() || plan_.vetoed.empty()) return plan_.name();
  Plan running;
  running.mode = plan_.mode;
  running.window = plan_.window;
  running.start = plan_.start;
  running.optimistic = plan_.optimistic;
  return running.name();
}

MeasuredOutcomes DeltaPolicy::measuredOutcomes() const {
  MeasuredOutcomes m;
  auto sums = [](const Outcome& o) { return MeasuredOutcomes::Sums{o.waited_ns, o.expected_ns}; };
  for (std::uint32_t c = 0; c < kSwapClasses; ++c) m.swap[c] = sums(swap_outcome_[c]);
  m.recompute = sums(recompute_outcome_);
  m.urgent_price = sums(urgent_price_);
  m.recent_load_ns = recentLoadNs(now_ns_);
  return m;
}

void DeltaPolicy::adoptOutcomes(const MeasuredOutcomes& m) {
  // The sums decay from now on, as if measured just now (the replay's clock is not this one).
  auto adopt = [this](Outcome& o, const MeasuredOutcomes::Sums& sums) { o = {sums.waited_ns, sums.expected_ns, now_ns_}; };
  for (std::uint32_t c = 0; c < kSwapClasses; ++c) adopt(swap_outcome_[c], m.swap[c]);
  adopt(recompute_outcome_, m.recompute);
  adopt(urgent_price_, m.urgent_price);
  // So does the link's load: the old mode's restores priced the new mode's first evictions
  // ahead as queued behind them (a tree-rnn at 30 %, 12 GB/s: 337 ms of load left by a mixed
  // first iteration, against 147 in the planned swap-only's own; every eviction ahead looked
  // dearer than an urgent one, so none was made, and that iteration ran at 226 % overhead
  // where the next ran at 85).
  recent_ns_ = m.recent_load_ns;
  recent_at_ns_ = now_ns_;
}

double DeltaPolicy::rankKey(BufferId id, const BufferState& state) const {
  // Predicted time of the next use, absolute: the farther, the sooner a candidate.
  const UseSchedule& schedule = pattern_.schedule();
  const std::uint32_t pos = pattern_.position();
  const UseSchedule::NextUse next = schedule.nextUse(id, pos);
  if (next.ns == kUnknownNs) {
    const std::int64_t period = schedule.ready() ? schedule.durationNs() : kDefaultPeriodNs;
    return static_cast<double>(state.last_use_ns + period);
  }
  return static_cast<double>(pattern_.iterationStartNs() + schedule.offsetNs(pos) + next.ns);
}

std::int64_t DeltaPolicy::periodNs() const {
  const UseSchedule& schedule = pattern_.schedule();
  return schedule.ready() && schedule.durationNs() > 0 ? schedule.durationNs() : kDefaultPeriodNs;
}

double DeltaPolicy::recentLoadNs(std::int64_t now_ns) const {
  const double dt = static_cast<double>(std::max<std::int64_t>(0, now_ns - recent_at_ns_));
  return recent_ns_ * std::exp(-dt / static_cast<double>(periodNs()));
}

void DeltaPolicy::residencyChanged(BufferId id) {
  const BufferState& s = table_[id];
  if (s.residency == Residency::kResident && owed_by_[id] > 0) {
    // A restore starts (onRestored): it loads the link for the period to come.
    recent_ns_ = recentLoadNs(s.last_use_ns) + static_cast<double>(owed_by_[id]);
    recent_at_ns_ = std::max(recent_at_ns_, s.last_use_ns);
  }
  if (s.residency == Residency::kEvicted) {
    // Evicted again before its use (a prefetch undone), or evicted anew: a new outcome starts.
    if (pending_[id] == Pending::kBack) closeOutcome(id, false);
    pending_[id] = Pending::kEvicted;
    waited_[id] = 0;
    expected_[id] = s.evicted_by == Action::kSwap ? costs_.transferNs(Direction::kHostToDevice, s.bytes)
                                                  : std::max<std::int64_t>(s.recompute_ns, 0);
  } else if (s.residency == Residency::kResident && pending_[id] == Pending::kEvicted) {
    pending_[id] = Pending::kBack;
  } else if (s.residency == Residency::kFree) {
    closeOutcome(id, false);  // never used again: what it cost so far is all it cost
  }
  const bool owes = s.residency == Residency::kEvicted && s.evicted_by == Action::kSwap;
  swapped_count_ = swapped_count_ - swapped_[id] + (owes ? 1u : 0u);
  swapped_[id] = owes ? 1 : 0;
  owed_ns_ -= owed_by_[id];
  owed_by_[id] = owes ? costs_.transferNs(Direction::kHostToDevice, s.bytes) : 0;
  owed_ns_ += owed_by_[id];
}

void DeltaPolicy::noteChoice(BufferId id, const BufferState& state, Action action) const {
  if (action == Action::kSwap) tentative_ns_ += costs_.transferNs(Direction::kHostToDevice, state.bytes);
  // chooseVictims rates a victim last just before it takes it: rated_* are this victim's.
  swap_class_[id] = static_cast<std::uint8_t>(rated_class_);
  if (rated_urgent_) {
    urgent_price_.add(static_cast<double>(rated_cost_ns_), static_cast<double>(state.bytes), now_ns_, periodNs());
  }
}

Policy::Rating DeltaPolicy::rate(BufferId id, const BufferState& state, const EvictRequest& request) const {
  const UseSchedule::NextUse next = pattern_.schedule().nextUse(id, pattern_.position());
  // Ahead of need, never a buffer that has to be back before the memory is needed (with a need
  // at the next launch, one that launch uses): evicting it only to restore it at once is pure
  // loss (a tree-rnn's recurrent weight, read every few launches, swapped out and back at each:
  // Tree-LSTM 30 %/12 GB/s 163 -> 133 %). Its restore has to start by its next use less its
  // transfer, and before the need has passed there is no memory to start it in.
  if ((request.not_before_ns > 0 || !request.urgent) && next.reused && next.ns != kUnknownNs) {
    const std::int64_t back_by =
        request.urgent ? next.ns : next.ns - costs_.transferNs(Direction::kHostToDevice, state.bytes);
    if (back_by <= request.not_before_ns) return {};
  }
  // Ahead of need, never a buffer the program frees before the memory is needed: the need
  // (upcomingBytes) is net of that free already, so evicting it makes no room that would not
  // be there anyway, and its copy out, cancelled by the free, only holds the link that later
  // copies need.
  if (!request.urgent && !next.reused && next.ns != kUnknownNs && next.ns <= request.not_before_ns) return {};
  const std::uint32_t cls =
      swapClass(request.urgent, next.ns, costs_.transferNs(Direction::kHostToDevice, state.bytes));
  Director::Decision d = director_.decide(state, next, request, costs_, owed_ns_ + tentative_ns_, recentLoadNs(request.now_ns), periodNs(),
                                                   swapVisibleShare(cls), recomputeFactor());
  if (!d.possible) {
    // Recompute-only as a plan (not the variant asked for) keeps the budget where drops cannot:
    // memory needed at once is taken from a buffer no hook can regenerate by a swap, after
    // every drop (a score below all of theirs). The replay chose the plan for a run that fitted
    // by drops alone; the real run may not (sizes rounded to the mapping granularity, buffers
    // below the shim's threshold, hooks registered late).
    if (!request.urgent || mode_ == DirectorMode::kRecomputeOnly || activeMode() != DirectorMode::kRecomputeOnly) {
      return {};
    }
    const std::int64_t swap_ns = costs_.transferNs(Direction::kDeviceToHost, state.bytes) +
                                 costs_.transferNs(Direction::kHostToDevice, state.bytes);
    const std::int64_t distance = next.ns != kUnknownNs ? next.ns : request.now_ns - state.last_use_ns;
    rated_cost_ns_ = swap_ns;
    rated_urgent_ = true;
    rated_class_ = cls;
    return {-1.0 / (1.0 + Filter::score(state.bytes, distance, swap_ns)), Action::kSwap, true};
  }
  if (pending_[id] == Pending::kBack && state.evicted_by == Action::kSwap) {
    // Restored (or being restored) for a use that has not come yet: evicting it throws that
    // transfer away and the restore must be paid again. Without this, prefetches and evictions
    // undo each other and the link carries restores that never serve a use. Ahead of need,
    // never: that would make room by undoing the prefetch the room was made for.
    if (!request.urgent) return {};
    d.cost_ns += costs_.transferNs(Direction::kHostToDevice, state.bytes);
  }
  // Evicting ahead of need is optional: it pays only when it costs less per byte than evicting
  // on demand has cost lately (a drop frees its memory at once when the need comes; only a copy
  // out gains from starting early). Otherwise wait: the urgent request will pick the cheapest
  // of everything, including buffers needed within this request's window. Before any urgent
  // eviction was seen there is no price to compare with, and the rating decides alone. A
  // swap's copy out is no reason to wait, though: whatever of it would show before the memory
  // is needed, all of it would on demand. So here a swap is priced by its restore alone (and
  // the measured share); its copy out counts in its rating. Priced in full, swaps ahead that
  // ended a little after the need were left for urgent requests: LSTM 30 %/50 GB/s 5.4 -> 6.6 %.
  if (!request.urgent && urgent_price_.expected_ns > 0) {
    std::int64_t optional_cost = d.cost_ns;
    if (d.action == Action::kSwap) {
      EvictRequest out_hidden = request;  // needed so late that the copy out never shows
      out_hidden.not_before_ns = std::numeric_limits<std::int64_t>::max() / 4;
      optional_cost = Director::swapCostNs(state.bytes, next, out_hidden, costs_, owed_ns_ + tentative_ns_,
                                           recentLoadNs(request.now_ns), periodNs(), swapVisibleShare(cls));
    }
    if (optional_cost > 0 &&
        static_cast<double>(optional_cost) > urgent_price_.ratio(0.0) * static_cast<double>(state.bytes)) {
      return {};
    }
  }
  rated_cost_ns_ = d.cost_ns;
  rated_urgent_ = request.urgent;
  rated_class_ = cls;
  const std::int64_t distance = next.ns != kUnknownNs ? next.ns : request.now_ns - state.last_use_ns;
  return {Filter::score(state.bytes, distance, d.cost_ns), d.action, true};
}

std::size_t DeltaPolicy::choosePrefetches(const PrefetchRequest& request, std::span<Prefetch> out) {
  // A recompute-only plan swaps what no hook can regenerate (rate); those come back ahead of
  // their use like any swap, not on demand in full view (the forced variant swaps nothing, so
  // it has nothing to prefetch). Measured: DenseNet-121 30 %/12 GB/s 142.9 -> 138.0 %
  // (docs/policy.md).
  if (swapped_count_ == 0) return 0;
  return Prefetcher::choose(pattern_.schedule(), pattern_.position(), table_, costs_, request, out,
                            pattern_.deviceWaits());
}

std::uint64_t DeltaPolicy::upcomingBytes(std::int64_t, std::int64_t& need_at_ns) const {
  return Prefetcher::upcomingBytes(pattern_.schedule(), pattern_.position(), table_, costs_, need_at_ns,
                                   activeWindow());
}

}  // namespace delta::policy
