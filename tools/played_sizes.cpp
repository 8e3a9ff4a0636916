// A workload as delta-play plays it under libdelta.so: see played_sizes.h.
#include "tools/played_sizes.h"

#include <algorithm>
#include <vector>

#include "tools/play/play_plan.h"

namespace delta::tools {

std::uint64_t playedBytes(std::uint64_t bytes, std::uint64_t scale) {
  const std::uint64_t scaled = (bytes + scale - 1) / std::max<std::uint64_t>(scale, 1);
  return std::max<std::uint64_t>((scaled + 7) / 8 * 8, 64);
}

policy::Workload played(const policy::Workload& workload, std::uint64_t scale) {
  policy::Workload out = workload;
  for (policy::WorkloadBuffer& b : out.buffers) b.bytes = playedBytes(b.bytes, scale);
  return out;
}

namespace {

struct PlayedLifetimes {
  std::vector<std::int32_t> freed_at;         // the op after which it is freed; -1: never
  std::vector<std::int32_t> unregistered_at;  // the op after which it is kept unregistered; -1
};

// Where delta-play --recompute frees each buffer, within the iteration, following its holds,
// and where it unregisters a result the program frees while others' registrations keep it
// (tools/play/delta_play.cpp, Player::step and the frees). An in-place write's unregistrations
// need no mark: the replay ends those recipes at the write itself.
PlayedLifetimes lifetimesWithRecompute(const policy::Workload& played, const ShimGranularity& shim) {
  const play::PlayPlan plan(played);
  const std::size_t n = played.buffers.size();
  PlayedLifetimes out{std::vector<std::int32_t>(n, -1), std::vector<std::int32_t>(n, -1)};
  std::vector<bool> registered(n, false), program_freed(n, false);
  std::vector<std::uint32_t> holds(n, 0);
  std::int32_t op_index = 0;
  auto free_now = [&](policy::BufferId b) {
    program_freed[b] = false;
    out.freed_at[b] = op_index;
  };
  auto unregister = [&](policy::BufferId b) {
    if (!registered[b]) return;
    registered[b] = false;
    for (policy::BufferId input : plan.producerInputs(b)) {
      if (holds[input] > 0 && --holds[input] == 0 && program_freed[input]) free_now(input);
    }
  };
  for (const policy::WorkloadOp& op : played.ops) {
    for (policy::BufferId w : op.writes) {
      for (policy::BufferId d : plan.dependents(w)) unregister(d);
      unregister(w);
    }
    for (policy::BufferId b : op.allocs) {
      // Registered only where the shim manages the buffer (it refuses the others).
      if (plan.recomputable(b) && played.buffers[b].bytes >= shim.min_bytes) {
        registered[b] = true;
        for (policy::BufferId input : plan.producerInputs(b)) ++holds[input];
      }
    }
    for (policy::BufferId b : op.frees) {
      program_freed[b] = true;
      if (registered[b] && holds[b] > 0) out.unregistered_at[b] = op_index;
      unregister(b);
      if (holds[b] == 0) free_now(b);
    }
    ++op_index;
  }
  return out;
}

}  // namespace

policy::Workload asManagedByShim(const policy::Workload& played, bool recompute,
                                 const ShimGranularity& shim) {
  policy::Workload out = played;
  if (recompute) {
    const PlayedLifetimes lifetimes = lifetimesWithRecompute(played, shim);
    for (policy::WorkloadOp& op : out.ops) op.frees.clear();
    for (policy::BufferId b = 0; b < out.buffers.size(); ++b) {
      const std::int32_t freed = lifetimes.freed_at[b], unregistered = lifetimes.unregistered_at[b];
      if (freed >= 0) out.ops[static_cast<std::size_t>(freed)].frees.push_back(b);
      if (unregistered >= 0 && unregistered != freed)
        out.ops[static_cast<std::size_t>(unregistered)].unregisters.push_back(b);
    }
  }
  const std::uint64_t granule = std::max<std::uint64_t>(shim.granule, 1);
  for (policy::WorkloadBuffer& b : out.buffers) {
    // The link carries the buffer's own bytes, the budget counts the granules it takes.
    b.copy_bytes = b.bytes < shim.min_bytes ? 0 : b.bytes;
    b.bytes = b.bytes < shim.min_bytes ? 0 : (b.bytes + granule - 1) / granule * granule;
  }
  return out;
}

}  // namespace delta::tools
