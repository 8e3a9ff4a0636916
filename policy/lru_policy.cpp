// The lru baseline: see lru_policy.h.
#include "policy/lru_policy.h"

namespace delta::policy {

Policy::Rating LruPolicy::rate(BufferId, const BufferState& state, const EvictRequest& request) const {
  return {static_cast<double>(request.now_ns - state.last_use_ns), Action::kSwap, true};
}

}  // namespace delta::policy
