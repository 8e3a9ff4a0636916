// A workload as delta-play plays it under libdelta.so: every size divided by the play's scale
// (delta-play --scale), and then what the shim does with sizes, which does not scale: buffers
// below its threshold (DELTA_MIN_BYTES) are left unmanaged (outside the budget, never moved),
// and each managed one takes whole granules of the device's memory (the shim also tells the
// policy that rounded size). A replay of this workload predicts the run delta-play measures;
// a replay of the original predicts the full-size job, where neither effect is felt.
#pragma once

#include <cstdint>

#include "policy/workload.h"

namespace delta::tools {

// A buffer's size once every size is divided by `scale`: a multiple of 8, at least 64 bytes
// (delta-play's room for the tokens it checks at the start, middle and end).
std::uint64_t playedBytes(std::uint64_t bytes, std::uint64_t scale);

struct ShimGranularity {
  std::uint64_t min_bytes = 1u << 20;  // DELTA_MIN_BYTES' default
  std::uint64_t granule = 2u << 20;    // the device's mapping granularity (2 MiB on GPUs today)
};

// Sizes divided by `scale` (playedBytes), every size alone: the workload delta-play plays.
policy::Workload played(const policy::Workload& workload, std::uint64_t scale);
// `played` as the shim's budget sees it: buffers below the threshold have no size (they take
// no part in the budget), the others are rounded up to whole granules. With `recompute`
// (delta-play --recompute), each buffer is freed where delta-play frees it: a result it
// registers (recomputable, and managed) keeps its producer's inputs alive until it is freed
// or unregistered (an input written in place unregisters what was computed from it), so the
// inputs live longer than the program needs them (LSTM at --scale 8: a managed peak of 841 MB
// against 300 MB without). A registered result the program frees while it is kept so is
// unregistered there (WorkloadOp::unregisters): from then on it can only be swapped, and if
// it was dropped it is regenerated then.
policy::Workload asManagedByShim(const policy::Workload& played, bool recompute,
                                 const ShimGranularity& shim = {});

}  // namespace delta::tools
