// DELTA's director: for one buffer about to be released, swap or drop-and-recompute, by what each
// would cost the compute stream. A swap costs the device-to-host copy when the memory is needed
// now (plus the copies already queued ahead of it), and the part of the host-to-device copy
// (plus the restores queued ahead of it: a saturated link hides nothing) that prefetching cannot
// hide before the predicted next use. A recompute costs the hook's time.
// Recompute wins only when a hook exists and it is strictly cheaper. O(1), no allocation.
#pragma once

#include <cstdint>

#include "policy/buffer_table.h"
#include "policy/cost_model.h"
#include "policy/types.h"

namespace delta::policy {

enum class DirectorMode : std::uint8_t { kMixed, kSwapOnly, kRecomputeOnly };

class Director {
 public:
  struct Decision {
    Action action = Action::kSwap;
    std::int64_t cost_ns = 0;  // expected time added to the compute stream
    bool possible = false;
  };

  explicit Director(DirectorMode mode) : mode_(mode) {}

  // `next_use_ns`: predicted time until the next use, kUnknownNs when not predicted (then the
  // restore is assumed to happen on demand, fully visible).
  Decision decide(const BufferState& buffer, std::int64_t next_use_ns, const EvictRequest& request,
                  const CostModel& costs) const;

  static std::int64_t swapCostNs(std::uint64_t bytes, std::int64_t next_use_ns,
                                 const EvictRequest& request, const CostModel& costs);

 private:
  DirectorMode mode_;
};

}  // namespace delta::policy
