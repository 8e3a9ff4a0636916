// Swap-or-recompute decision: see director.h.
#include "policy/director.h"

#include <algorithm>

namespace delta::policy {

std::int64_t Director::swapCostNs(std::uint64_t bytes, UseSchedule::NextUse next, const EvictRequest& request,
                                  const CostModel& costs, std::int64_t owed_restore_ns,
                                  double recent_restore_ns, std::int64_t period_ns,
                                  double on_demand_share) {
  const std::int64_t d2h = costs.transferNs(Direction::kDeviceToHost, bytes);
  const std::int64_t h2d = costs.transferNs(Direction::kHostToDevice, bytes);
  auto backlog = [&](std::int64_t busy_until) { return std::max<std::int64_t>(0, busy_until - request.now_ns); };
  // The copy out queues behind the copies already issued. Asked now, the memory waits for it;
  // asked ahead, only the part that ends after the memory is needed shows.
  const std::int64_t out_done = backlog(request.d2h_busy_until_ns) + d2h;
  const std::int64_t visible_out =
      request.urgent ? out_done : std::max<std::int64_t>(0, out_done - request.not_before_ns);
  if (next.ns == kUnknownNs) return visible_out + backlog(request.h2d_busy_until_ns) + h2d;  // on demand
  if (!next.reused) {
    // Freed before it is needed: never restored. Its copy out still holds memory and the link
    // for a while, which the measured share covers (waits for copies out count in it).
    return std::max(visible_out, static_cast<std::int64_t>(on_demand_share * static_cast<double>(d2h)));
  }
  // The restore waits for its own copy out and for the link time already owed.
  const std::int64_t in_done =
      std::max(out_done, backlog(request.h2d_busy_until_ns) + std::max<std::int64_t>(0, owed_restore_ns)) + h2d;
  std::int64_t late = std::max<std::int64_t>(0, in_done - next.ns);
  if (period_ns > 0) {
    // Per iteration, the link carries at most one iteration's worth of restores: what it carried
    // over the last one, plus what is owed, plus this one, beyond that length is time the
    // iteration will wait for, whatever the order of the restores.
    const double load = recent_restore_ns + static_cast<double>(std::max<std::int64_t>(0, owed_restore_ns) + h2d);
    late = std::max<std::int64_t>(late, static_cast<std::int64_t>(load) - period_ns);
    // Below that, a busy link still delays: a transfer arriving at a link busy a share u of the
    // time waits, on average, about u / (1 - u) transfers (a single queue with random
    // arrivals). The price rises smoothly with the load, so swaps stop before the link
    // saturates instead of after, and recomputes take over the marginal buffers.
    const double u = std::min(kMaxUtilisation, recent_restore_ns / static_cast<double>(period_ns));
    late = std::max<std::int64_t>(late, static_cast<std::int64_t>(static_cast<double>(h2d) * u / (1.0 - u)));
  }
  // What swaps have really cost lately (launches waiting for their copies out to free memory
  // and for their restores), per ns of transfer: the model above cannot see memory it has no
  // room to prefetch into, nor copies out that hold memory the next launch needs.
  return std::max(visible_out + late, static_cast<std::int64_t>(on_demand_share * static_cast<double>(h2d)));
}

std::int64_t Director::recomputeCostNs(const BufferState& buffer, UseSchedule::NextUse next, double factor) {
  if (buffer.recompute_ns == kUnknownNs) return kUnknownNs;
  if (next.ns != kUnknownNs && !next.reused) return 0;
  return static_cast<std::int64_t>(static_cast<double>(buffer.recompute_ns) * std::max(factor, 0.0));
}

Director::Decision Director::decide(const BufferState& buffer, UseSchedule::NextUse next,
                                    const EvictRequest& request, const CostModel& costs,
                                    std::int64_t owed_restore_ns, double recent_restore_ns,
                                    std::int64_t period_ns, double on_demand_share,
                                    double recompute_factor) const {
  const std::int64_t recompute = recomputeCostNs(buffer, next, recompute_factor);
  const bool can_recompute = recompute != kUnknownNs;
  switch (mode_) {
    case DirectorMode::kSwapOnly:
      return {Action::kSwap, swapCostNs(buffer.bytes, next, request, costs, owed_restore_ns, recent_restore_ns, period_ns, on_demand_share), true};
    case DirectorMode::kRecomputeOnly:
      return {Action::kRecompute, recompute, can_recompute};
    case DirectorMode::kMixed:
      break;
  }
  const std::int64_t swap = swapCostNs(buffer.bytes, next, request, costs, owed_restore_ns, recent_restore_ns, period_ns, on_demand_share);
  if (can_recompute && (recompute <= swap)) return {Action::kRecompute, recompute, true};
  return {Action::kSwap, swap, true};
}

}  // namespace delta::policy
