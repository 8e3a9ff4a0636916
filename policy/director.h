// DELTA's director: for one buffer about to be released, swap or drop-and-recompute, by what each
// would cost the compute stream.
// - A swap costs the device-to-host copy when the memory is needed now (behind the copies
//   already queued, including the ones chosen earlier in the same request), and the part of the
//   host-to-device copy that cannot be hidden before the predicted next use. The restore cannot
//   start before its copy out ends, and it shares the link with everything the policy already
//   owes: the restores queued on the engine and the restores of every buffer it swapped out and
//   has not brought back yet (the policy's own future restores, counted as due first). A link
//   the policy has already loaded therefore hides nothing more, and further swaps show their cost.
// - A recompute costs the hook's time, and only if a hook exists.
// - A buffer predicted to be freed before any further use is never brought back: a drop costs
//   nothing and a swap only its copy out.
// The cheaper wins; on a tie the drop, which frees memory at once and leaves the link to others.
// O(1), no allocation.
#pragma once

#include <cstdint>

#include "policy/buffer_table.h"
#include "policy/cost_model.h"
#include "policy/types.h"
#include "policy/use_schedule.h"

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

  // `next`: predicted next use (ns == kUnknownNs when not predicted: the restore is then assumed
  // to happen on demand, fully visible). `owed_restore_ns`: host-to-device time of the restores
  // the policy owes for buffers it swapped out and has not restored yet.
  Decision decide(const BufferState& buffer, UseSchedule::NextUse next, const EvictRequest& request,
                  const CostModel& costs, std::int64_t owed_restore_ns = 0, double recent_restore_ns = 0,
                  std::int64_t period_ns = 0, double on_demand_share = 0) const;

  static std::int64_t swapCostNs(std::uint64_t bytes, UseSchedule::NextUse next, const EvictRequest& request,
                                 const CostModel& costs, std::int64_t owed_restore_ns = 0,
                                 double recent_restore_ns = 0, std::int64_t period_ns = 0,
                                 double on_demand_share = 0);
  static std::int64_t recomputeCostNs(const BufferState& buffer, UseSchedule::NextUse next);

 private:
  DirectorMode mode_;
};

}  // namespace delta::policy
