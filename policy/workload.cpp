// Workload model: see workload.h.
#include "policy/workload.h"

#include <algorithm>
#include <cmath>

namespace delta::policy {

std::int64_t Workload::computeNs() const {
  std::int64_t total = 0;
  for (const WorkloadOp& op : ops) total += op.compute_ns;
  return total;
}

std::uint64_t Workload::peakBytes() const {
  std::uint64_t live = 0;
  for (const WorkloadBuffer& b : buffers) {
    if (b.persistent) live += b.bytes;
  }
  std::uint64_t peak = live;
  for (const WorkloadOp& op : ops) {
    for (BufferId id : op.allocs) live += buffers[id].bytes;
    peak = std::max(peak, live);
    for (BufferId id : op.frees) live -= buffers[id].bytes;
  }
  return peak;
}

std::string Workload::validate() const {
  enum class S : std::uint8_t { kNone, kLive, kDead };
  std::vector<S> state(buffers.size(), S::kNone);
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].persistent) state[i] = S::kLive;
    const std::int32_t p = buffers[i].producer;
    if (p >= 0 && static_cast<std::size_t>(p) >= ops.size()) {
      return "buffer " + buffers[i].name + ": producer op out of range";
    }
  }
  auto bad = [&](std::size_t i, BufferId id, const char* what) {
    return "op " + std::to_string(i) + " (" + ops[i].name + "): buffer " +
           (id < buffers.size() ? buffers[id].name : std::to_string(id)) + " " + what;
  };
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const WorkloadOp& op = ops[i];
    if (op.compute_ns < 0) return "op " + std::to_string(i) + ": negative compute time";
    for (BufferId id : op.allocs) {
      if (id >= buffers.size()) return bad(i, id, "does not exist");
      if (state[id] == S::kLive) return bad(i, id, "allocated while live");
      state[id] = S::kLive;
    }
    for (const auto* list : {&op.reads, &op.writes, &op.unregisters, &op.frees}) {
      for (BufferId id : *list) {
        if (id >= buffers.size()) return bad(i, id, "does not exist");
        if (state[id] != S::kLive) return bad(i, id, "used while not allocated");
      }
    }
    for (BufferId id : op.frees) {
      if (buffers[id].persistent) return bad(i, id, "is persistent and cannot be freed");
      state[id] = S::kDead;
    }
  }
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    if (!buffers[i].persistent && state[i] == S::kLive) {
      return "buffer " + buffers[i].name + " is still allocated at the end of the iteration";
    }
  }
  return {};
}

Workload Workload::scaled(double factor) const {
  Workload w = *this;
  auto scale = [factor](std::int64_t ns) {
    return static_cast<std::int64_t>(std::llround(static_cast<double>(ns) * factor));
  };
  for (WorkloadBuffer& b : w.buffers) {
    if (!b.persistent && b.scales_with_batch) {
      b.bytes = static_cast<std::uint64_t>(std::llround(static_cast<double>(b.bytes) * factor));
      b.copy_bytes = static_cast<std::uint64_t>(std::llround(static_cast<double>(b.copy_bytes) * factor));
    }
    // A recompute re-runs the producer: it grows as the producer's time does.
    const bool producer_scales =
        b.producer >= 0 && static_cast<std::size_t>(b.producer) < ops.size()
            ? ops[static_cast<std::size_t>(b.producer)].scales_with_batch
            : b.scales_with_batch;
    if (b.recompute_ns != kUnknownNs && producer_scales) b.recompute_ns = scale(b.recompute_ns);
  }
  for (WorkloadOp& op : w.ops) {
    if (op.scales_with_batch) op.compute_ns = scale(op.compute_ns);
  }
  return w;
}

std::vector<BufferId> WorkloadOp::workingSet() const {
  std::vector<BufferId> ids;
  ids.reserve(allocs.size() + reads.size() + writes.size());
  for (const auto* list : {&allocs, &reads, &writes}) {
    for (BufferId id : *list) {
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    }
  }
  return ids;
}

UseSchedule Workload::schedule() const {
  std::size_t uses = 0;
  for (const WorkloadOp& op : ops) uses += op.allocs.size() + op.reads.size() + op.writes.size();
  UseSchedule s;
  s.reserve(static_cast<std::uint32_t>(buffers.size()), static_cast<std::uint32_t>(ops.size()),
            static_cast<std::uint32_t>(uses));
  std::int64_t t = 0;
  for (const WorkloadOp& op : ops) {
    std::uint64_t alloc = 0;
    for (BufferId id : op.allocs) alloc += buffers[id].bytes;
    s.addLaunch(t, alloc, op.workingSet());
    for (BufferId id : op.frees) s.addFree(id, buffers[id].bytes);
    t += op.compute_ns;
  }
  s.finish(t);
  return s;
}

}  // namespace delta::policy
