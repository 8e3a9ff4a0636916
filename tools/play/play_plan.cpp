// What delta-play does with a workload: see play_plan.h.
#include "tools/play/play_plan.h"

#include <algorithm>

namespace delta::play {

namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t splitmix(uint64_t x) {
  x += kGolden;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

PlayPlan::PlayPlan(const policy::Workload& workload)
    : workload_(workload), ops_(workload.ops.size()), dependents_(workload.buffers.size()) {
  const size_t nbuf = workload.buffers.size();
  // The last op of an iteration that writes each buffer: what a persistent buffer read before
  // any write of the next iteration must show.
  std::vector<int32_t> lastOfIteration(nbuf, -1);
  for (size_t j = 0; j < workload.ops.size(); ++j) {
    for (BufferId b : workload.ops[j].allocs) lastOfIteration[b] = static_cast<int32_t>(j);
    for (BufferId b : workload.ops[j].writes) lastOfIteration[b] = static_cast<int32_t>(j);
  }
  std::vector<int32_t> lastWriter(nbuf, -1);
  for (size_t j = 0; j < workload.ops.size(); ++j) {
    const policy::WorkloadOp& op = workload.ops[j];
    OpPlan& plan = ops_[j];
    auto has = [&plan](BufferId b) {
      return std::any_of(plan.params.begin(), plan.params.end(),
                         [b](const Param& p) { return p.buffer == b; });
    };
    auto input = [&](BufferId b, Role role) {
      Param p;
      p.buffer = b;
      p.role = role;
      if (lastWriter[b] >= 0) {
        p.producer = lastWriter[b];
      } else if (workload.buffers[b].persistent && lastOfIteration[b] >= 0) {
        p.producer = lastOfIteration[b];
        p.previousIteration = true;
      }
      plan.params.push_back(p);
    };
    for (BufferId b : op.allocs)
      if (!has(b)) plan.params.push_back(Param{b, Role::kAlloc, -1, false});
    for (BufferId b : op.writes)
      if (!has(b)) input(b, Role::kWrite);
    for (BufferId b : op.reads)
      if (!has(b)) input(b, Role::kRead);
    for (const Param& p : plan.params)
      if (p.role != Role::kRead) lastWriter[p.buffer] = static_cast<int32_t>(j);
    maxParams_ = std::max(maxParams_, plan.params.size());
  }
  for (BufferId b = 0; b < nbuf; ++b)
    if (recomputable(b))
      for (BufferId input : producerInputs(b)) dependents_[input].push_back(b);
}

uint64_t PlayPlan::expected(uint32_t iteration, const Param& param) const {
  if (param.producer < 0) return 0;
  if (!param.previousIteration) return serial(iteration, static_cast<size_t>(param.producer));
  return iteration == 0 ? 0 : serial(iteration - 1, static_cast<size_t>(param.producer));
}

std::vector<uint64_t> PlayPlan::tokenOffsets(uint64_t bytes) {
  std::vector<uint64_t> offsets{0, (bytes / 2) / 8 * 8, (bytes - 8) / 8 * 8};
  std::sort(offsets.begin(), offsets.end());
  offsets.erase(std::unique(offsets.begin(), offsets.end()), offsets.end());
  return offsets;
}

uint64_t PlayPlan::token(uint64_t serial, BufferId buffer) {
  return splitmix(serial * kGolden ^ (uint64_t(buffer) + 1));
}

bool PlayPlan::recomputable(BufferId buffer) const {
  const policy::WorkloadBuffer& b = workload_.buffers[buffer];
  return !b.persistent && b.producer >= 0 && b.recompute_ns != policy::kUnknownNs;
}

const std::vector<BufferId>& PlayPlan::producerInputs(BufferId buffer) const {
  static const std::vector<BufferId> kNone;
  const int32_t producer = workload_.buffers[buffer].producer;
  if (producer < 0) return kNone;
  // The producer's reads, as the workload lists them (a result is never its own input).
  return workload_.ops[static_cast<size_t>(producer)].reads;
}

}  // namespace delta::play
