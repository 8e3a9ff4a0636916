// The delta policy: see delta_policy.h.
#include "policy/delta_policy.h"

#include <cmath>
#include <limits>

#include "policy/filter.h"
#include "policy/prefetcher.h"

namespace delta::policy {

DeltaPolicy::DeltaPolicy(const PolicyConfig& config, DirectorMode mode)
    : Policy(config),
      pattern_(config.max_buffers, config.max_launches, config.max_uses),
      director_(mode),
      mode_(mode),
      owed_by_(config.max_buffers, 0),
      restore_started_(config.max_buffers, kUnknownNs) {}

std::string_view DeltaPolicy::name() const {
  switch (mode_) {
    case DirectorMode::kSwapOnly: return "swap-only";
    case DirectorMode::kRecomputeOnly: return "recompute-only";
    case DirectorMode::kMixed: break;
  }
  return "delta";
}

void DeltaPolicy::onAlloc(BufferId id, std::uint64_t bytes, std::int64_t now_ns) {
  pattern_.onAlloc(bytes);
  Policy::onAlloc(id, bytes, now_ns);
}

void DeltaPolicy::onFree(BufferId id, std::int64_t now_ns) {
  Policy::onFree(id, now_ns);
  pattern_.onFree(id);
}

void DeltaPolicy::onLaunch(const Launch& launch) {
  // Learn first, so that the ranks computed for the launch's buffers see the position after it.
  checkRestores(launch);
  pattern_.onLaunch(launch);
  relearnIfChanged();
  Policy::onLaunch(launch);
  last_launch_ns_ = launch.now_ns;
}

void DeltaPolicy::checkRestores(const Launch& launch) {
  for (BufferId id : launch.buffers) {
    if (!table_.valid(id) || restore_started_[id] == kUnknownNs) continue;
    // Started after the previous launch: it was fetched for this one, on demand.
    const double on_demand = restore_started_[id] > last_launch_ns_ ? 1.0 : 0.0;
    on_demand_share_ += kOutcomeWeight * (on_demand - on_demand_share_);
    restore_started_[id] = kUnknownNs;
  }
}

void DeltaPolicy::onIteration(std::int64_t now_ns) {
  pattern_.onIteration(now_ns);
  relearnIfChanged();
}

void DeltaPolicy::relearnIfChanged() {
  if (pattern_.generation() == generation_) return;
  generation_ = pattern_.generation();
  reindexAll();  // every prediction changed: once per learned iteration
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
    restore_started_[id] = s.last_use_ns;
  }
  const bool owes = s.residency == Residency::kEvicted && s.evicted_by == Action::kSwap;
  owed_ns_ -= owed_by_[id];
  owed_by_[id] = owes ? costs_.transferNs(Direction::kHostToDevice, s.bytes) : 0;
  owed_ns_ += owed_by_[id];
}

void DeltaPolicy::noteChoice(BufferId, const BufferState& state, Action action) const {
  if (action == Action::kSwap) tentative_ns_ += costs_.transferNs(Direction::kHostToDevice, state.bytes);
}

Policy::Rating DeltaPolicy::rate(BufferId id, const BufferState& state, const EvictRequest& request) const {
  const UseSchedule::NextUse next = pattern_.schedule().nextUse(id, pattern_.position());
  if (request.not_before_ns > 0 && next.reused && next.ns != kUnknownNs && next.ns <= request.not_before_ns) {
    return {};
  }
  const Director::Decision d = director_.decide(state, next, request, costs_, owed_ns_ + tentative_ns_, recentLoadNs(request.now_ns), periodNs(),
                                                   on_demand_share_);
  if (!d.possible) return {};
  const std::int64_t distance = next.ns != kUnknownNs ? next.ns : request.now_ns - state.last_use_ns;
  return {Filter::score(state.bytes, distance, d.cost_ns), d.action, true};
}

std::size_t DeltaPolicy::choosePrefetches(const PrefetchRequest& request, std::span<Prefetch> out) {
  if (mode_ == DirectorMode::kRecomputeOnly) return 0;
  return Prefetcher::choose(pattern_.schedule(), pattern_.position(), table_, costs_, request, out);
}

std::uint64_t DeltaPolicy::upcomingBytes(std::int64_t, std::int64_t& horizon_ns) const {
  return Prefetcher::upcomingBytes(pattern_.schedule(), pattern_.position(), table_, costs_, horizon_ns);
}

}  // namespace delta::policy
