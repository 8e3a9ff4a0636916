// The delta policy: see delta_policy.h.
#include "policy/delta_policy.h"

#include "policy/filter.h"
#include "policy/prefetcher.h"

namespace delta::policy {

DeltaPolicy::DeltaPolicy(const PolicyConfig& config, DirectorMode mode)
    : Policy(config),
      pattern_(config.max_buffers, config.max_launches, config.max_uses),
      director_(mode),
      mode_(mode) {}

std::string_view DeltaPolicy::name() const {
  switch (mode_) {
    case DirectorMode::kSwapOnly: return "swap-only";
    case DirectorMode::kRecomputeOnly: return "recompute-only";
    case DirectorMode::kMixed: break;
  }
  return "delta";
}

void DeltaPolicy::onAlloc(BufferId id, std::uint64_t bytes, std::int64_t now_ns) {
  Policy::onAlloc(id, bytes, now_ns);
  pattern_.onAlloc(bytes);
}

void DeltaPolicy::onFree(BufferId id, std::int64_t now_ns) {
  Policy::onFree(id, now_ns);
  pattern_.onFree(id);
}

void DeltaPolicy::onLaunch(const Launch& launch) {
  Policy::onLaunch(launch);
  pattern_.onLaunch(launch);
}

void DeltaPolicy::onIteration(std::int64_t now_ns) { pattern_.onIteration(now_ns); }

Policy::Rating DeltaPolicy::rate(BufferId id, const BufferState& state,
                                 const EvictRequest& request) const {
  const std::int64_t next_use = pattern_.schedule().nextUseNs(id, pattern_.position());
  if (request.not_before_ns > 0 && next_use != kUnknownNs && next_use <= request.not_before_ns) {
    return {};
  }
  const Director::Decision d = director_.decide(state, next_use, request, costs_);
  if (!d.possible) return {};
  const std::int64_t distance =
      next_use != kUnknownNs ? next_use : request.now_ns - state.last_use_ns;
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
