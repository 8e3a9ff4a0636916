// Delta's planner: which of the director's modes to run for the iteration just learned.
//
// Training repeats one iteration. Once delta has learned it (access_pattern.h), the planner
// rebuilds it as a workload (one op per launch; the time to the next launch, less what that
// launch waited for memory, as its compute; each buffer allocated at its first use and freed
// where it was; the hooks' recompute costs, the launch that allocated a buffer as its producer
// and the other buffers of that launch as its inputs) and replays it on the policy's own model
// of the GPU (the budget, the measured link) under each mode: mixed, swap-only,
// recompute-only. The fastest is kept until the iteration changes.
//
// Why: the director decides one buffer at a time from modelled and measured costs, and on some
// workloads and links the mix it reaches is slower than one of the pure modes (swaps that cost
// more than the recomputes they replace, or the other way round; docs/policy.md has the rows).
// A replay of the whole iteration sees what one decision at a time cannot: how the choices add
// up on the link and in memory. Measured outcomes (onWaited) still correct each decision
// within the chosen mode.
//
// Cost: building the workload is O(launches + uses); each replay is the simulator's cost for
// two iterations (one to learn, one measured). It allocates, so it runs only when a new
// iteration is learned (a stable loop: once), never per launch. Not on the hot path's
// per-call budget; docs/policy.md gives the time on the shared traces.
#pragma once

#include <cstdint>
#include <span>

#include "policy/cost_model.h"
#include "policy/director.h"
#include "policy/policy.h"
#include "policy/use_schedule.h"
#include "policy/workload.h"

namespace delta::policy {

// What the planner knows of each buffer id of the learned iteration, kept past its free.
struct PlannedBuffer {
  std::uint64_t bytes = 0;
  std::int64_t recompute_ns = kUnknownNs;  // the hook's cost when it was last allocated
  // The launch after which it could no longer be recomputed (written in place), if it was
  // recomputable: replayed as a write at that launch, which ends recomputability there too.
  std::uint32_t lost_at = UseSchedule::kNoPos;
};

struct Plan {
  DirectorMode mode = DirectorMode::kMixed;
  bool planned = false;  // false: no budget, no usable iteration; the mode stays mixed
  // Predicted iteration time under each mode (indexed by DirectorMode); -1 when not replayed.
  std::int64_t predicted_ns[3] = {-1, -1, -1};
  std::uint64_t over_budget_ops[3] = {};  // ops the replay ran over the budget, per mode
};

class Planner {
 public:
  // The learned iteration as a workload. `buffers` is indexed by buffer id; `waited_ns` by
  // launch position (what each launch waited for memory, restores and recomputes).
  static Workload workloadFrom(const UseSchedule& schedule, std::span<const PlannedBuffer> buffers,
                               std::span<const std::int64_t> waited_ns);

  // Replays `workload` under each mode within `budget_bytes` on a link as `costs` measured it,
  // and returns the fastest (ties: mixed first, then swap-only). A mode that runs ops over the
  // budget loses to one that does not. Nothing is planned (mixed) when the workload's peak fits
  // the budget.
  static Plan choose(const Workload& workload, std::uint64_t budget_bytes, const CostModel& costs);
};

}  // namespace delta::policy
