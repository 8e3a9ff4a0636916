// The belady bound: see belady_policy.h.
#include "policy/belady_policy.h"

#include <limits>

#include "policy/prefetcher.h"

namespace delta::policy {

BeladyPolicy::BeladyPolicy(const PolicyConfig& config, const UseSchedule& future)
    : Policy(config), future_(future) {}

void BeladyPolicy::onLaunch(const Launch& launch) {
  ++position_;  // first: the launch's buffers are ranked by their use after this one
  Policy::onLaunch(launch);
}

double BeladyPolicy::rankKey(BufferId id, const BufferState& state) const {
  const std::int64_t next_use = future_.nextUseNs(id, position_);
  if (next_use == kUnknownNs) return std::numeric_limits<double>::max();
  return static_cast<double>(state.last_use_ns + next_use);  // absolute: farthest first
}

void BeladyPolicy::onIteration(std::int64_t) { position_ = 0; }

Policy::Rating BeladyPolicy::rate(BufferId id, const BufferState&, const EvictRequest& request) const {
  const std::int64_t next_use = future_.nextUseNs(id, position_);
  if (next_use == kUnknownNs) return {std::numeric_limits<double>::max(), Action::kSwap, true};
  if (request.not_before_ns > 0 && next_use <= request.not_before_ns) return {};
  return {static_cast<double>(next_use), Action::kSwap, true};
}

std::size_t BeladyPolicy::choosePrefetches(const PrefetchRequest& request, std::span<Prefetch> out) {
  return Prefetcher::choose(future_, position_, table_, costs_, request, out);
}

std::uint64_t BeladyPolicy::upcomingBytes(std::int64_t, std::int64_t& need_at_ns) const {
  // Room ahead keeps everything the window uses, not only what is used before the memory is
  // needed (delta's rule): belady stays the reference it has been in every table so far.
  std::int64_t window_ns = 0;
  const std::uint64_t need =
      Prefetcher::upcomingBytes(future_, position_, table_, costs_, need_at_ns, Prefetcher::Window::kGross, &window_ns);
  need_at_ns = window_ns;
  return need;
}

}  // namespace delta::policy
