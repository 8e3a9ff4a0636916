// The dtr baseline: see dtr_policy.h.
#include "policy/dtr_policy.h"

#include <algorithm>

namespace delta::policy {

Policy::Rating DtrPolicy::rate(BufferId, const BufferState& state, const EvictRequest& request) const {
  if (state.recompute_ns == kUnknownNs) return {};
  const double staleness = static_cast<double>(std::max<std::int64_t>(1, request.now_ns - state.last_use_ns));
  const double cost = static_cast<double>(std::max<std::int64_t>(1, state.recompute_ns));
  // Highest score first == lowest h.
  return {static_cast<double>(state.bytes) * staleness / cost, Action::kRecompute, true};
}

}  // namespace delta::policy
