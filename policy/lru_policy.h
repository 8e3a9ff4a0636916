// The `lru` baseline: page out the least recently used buffer, always by swapping, restore on
// demand (no prediction). Costs as in policy.h.
#pragma once

#include "policy/policy.h"

namespace delta::policy {

class LruPolicy : public Policy {
 public:
  using Policy::Policy;
  std::string_view name() const override { return "lru"; }

 protected:
  Rating rate(BufferId id, const BufferState& state, const EvictRequest& request) const override;
};

}  // namespace delta::policy
