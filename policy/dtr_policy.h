// The `dtr` baseline: Dynamic Tensor Rematerialization's heuristic h = cost / (bytes x staleness),
// lowest first, always dropping and recomputing; a buffer without a recompute hook is never
// evicted. This is DTR's simple h, without its evicted-neighbourhood term. Costs as in policy.h.
#pragma once

#include "policy/policy.h"

namespace delta::policy {

class DtrPolicy : public Policy {
 public:
  using Policy::Policy;
  std::string_view name() const override { return "dtr"; }

 protected:
  Rating rate(BufferId id, const BufferState& state, const EvictRequest& request) const override;
};

}  // namespace delta::policy
