// DELTA's director: for one buffer about to be released, swap or drop-and-recompute, by what each
// would cost the compute stream.
// - A swap costs the device-to-host copy when the memory is needed now (behind the copies
//   already queued, including the ones chosen earlier in the same request), and the part of the
//   host-to-device copy that cannot be hidden before the predicted next use. The restore cannot
//   start before its copy out ends, and it shares the link with everything the policy already
//   owes: the restores queued on the engine and the restores of every buffer it swapped out and
//   has not brought back yet (the policy's own future restores, counted as due first). A link
//   the policy has already loaded therefore hides nothing more, and further swaps show their cost.
//   A busy link also delays a restore before it saturates: the load of the last iteration
//   prices it (utilisation u: about u / (1 - u) transfers of queueing). And a swap costs at
//   least the share of its transfer that swaps have been measured to cost (the policy learns it
//   from the waits the caller reports), which covers what the model cannot see: no free memory
//   to prefetch into, copies out that hold memory the next launch needs.
// - A recompute costs the hook's time, times the measured factor (inputs dropped too), and
//   only if a hook exists.
// - A buffer predicted to be freed before any further use is never brought back: a drop costs
//   nothing and a swap only its copy out (at least the measured share of a transfer: a copy
//   out holds memory and the link while it runs).
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
  // the policy owes for buffers it swapped out and has not restored yet. `on_demand_share`: the
  // measured visible time of a swap per ns of its transfer (the name is the original one: it
  // was the share of restores that started on demand). `recompute_factor`: the measured
  // recompute time per ns of the hook's estimate.
  Decision decide(const BufferState& buffer, UseSchedule::NextUse next, const EvictRequest& request,
                  const CostModel& costs, std::int64_t owed_restore_ns = 0, double recent_restore_ns = 0,
                  std::int64_t period_ns = 0, double on_demand_share = 0,
                  double recompute_factor = 1.0) const;

  static std::int64_t swapCostNs(std::uint64_t bytes, UseSchedule::NextUse next, const EvictRequest& request,
                                 const CostModel& costs, std::int64_t owed_restore_ns = 0,
                                 double recent_restore_ns = 0, std::int64_t period_ns = 0,
                                 double on_demand_share = 0);
  // `factor`: measured recompute time per ns of the hook's estimate (its inputs may have to
  // come back first).
  static std::int64_t recomputeCostNs(const BufferState& buffer, UseSchedule::NextUse next,
                                      double factor = 1.0);

 private:
  // The link's utilisation is capped here for its queueing price (at most 19 transfers' wait).
  static constexpr double kMaxUtilisation = 0.95;

  DirectorMode mode_;
};

}  // namespace delta::policy
