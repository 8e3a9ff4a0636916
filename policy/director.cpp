// Swap-or-recompute decision: see director.h.
#include "policy/director.h"

#include <algorithm>

namespace delta::policy {

std::int64_t Director::swapCostNs(std::uint64_t bytes, std::int64_t next_use_ns,
                                  const EvictRequest& request, const CostModel& costs) {
  const std::int64_t d2h = costs.transferNs(Direction::kDeviceToHost, bytes);
  const std::int64_t h2d = costs.transferNs(Direction::kHostToDevice, bytes);
  auto backlog = [&](std::int64_t busy_until) { return std::max<std::int64_t>(0, busy_until - request.now_ns); };
  // The copy out queues behind the copies already issued. Asked now, the memory waits for it;
  // asked ahead, only the part that ends after the memory is needed shows.
  const std::int64_t out_done = backlog(request.d2h_busy_until_ns) + d2h;
  const std::int64_t visible_out =
      request.urgent ? out_done : std::max<std::int64_t>(0, out_done - request.not_before_ns);
  // The restore queues behind the restores already issued: a saturated link hides nothing.
  const std::int64_t in_time = backlog(request.h2d_busy_until_ns) + h2d;
  if (next_use_ns == kUnknownNs) return visible_out + in_time;
  const std::int64_t window = std::max<std::int64_t>(0, next_use_ns - out_done);
  return visible_out + std::max<std::int64_t>(0, in_time - window);
}

Director::Decision Director::decide(const BufferState& buffer, std::int64_t next_use_ns,
                                    const EvictRequest& request, const CostModel& costs) const {
  const bool can_recompute = buffer.recompute_ns != kUnknownNs;
  switch (mode_) {
    case DirectorMode::kSwapOnly:
      return {Action::kSwap, swapCostNs(buffer.bytes, next_use_ns, request, costs), true};
    case DirectorMode::kRecomputeOnly:
      return {Action::kRecompute, buffer.recompute_ns, can_recompute};
    case DirectorMode::kMixed:
      break;
  }
  const std::int64_t swap = swapCostNs(buffer.bytes, next_use_ns, request, costs);
  if (can_recompute && buffer.recompute_ns < swap) return {Action::kRecompute, buffer.recompute_ns, true};
  return {Action::kSwap, swap, true};
}

}  // namespace delta::policy
