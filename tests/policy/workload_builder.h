// Test helper: builds small Workloads by hand, and a synthetic training iteration (a forward
// chain whose activations are kept for a backward pass that walks it in reverse).
#pragma once

#include <string>
#include <vector>

#include "policy/workload.h"

namespace delta::policy::testing {

class WorkloadBuilder {
 public:
  BufferId persistent(const std::string& name, std::uint64_t bytes) {
    w_.buffers.push_back({name, bytes, true, -1, kUnknownNs});
    return static_cast<BufferId>(w_.buffers.size() - 1);
  }
  // An op; `results` are new buffers of the given sizes, recomputable at the op's time.
  std::vector<BufferId> op(const std::string& name, std::int64_t ns, std::vector<BufferId> reads,
                           std::vector<std::uint64_t> results = {}, std::vector<BufferId> writes = {},
                           bool recomputable = true) {
    WorkloadOp o{name, ns, {}, std::move(reads), std::move(writes), {}};
    const auto index = static_cast<std::int32_t>(w_.ops.size());
    std::vector<BufferId> ids;
    for (std::uint64_t bytes : results) {
      w_.buffers.push_back({name + std::to_string(ids.size()), bytes, false, index,
                            recomputable ? ns : kUnknownNs});
      ids.push_back(static_cast<BufferId>(w_.buffers.size() - 1));
      o.allocs.push_back(ids.back());
    }
    w_.ops.push_back(std::move(o));
    return ids;
  }
  void free(BufferId id) { w_.ops.back().frees.push_back(id); }
  Workload take() { return std::move(w_); }

 private:
  Workload w_;
};

// `layers` layers, activations of `act_bytes` made in `fwd_ns` each, weights of `w_bytes`;
// backward ops take 2 x fwd_ns and free the activation they consume.
inline Workload trainingWorkload(int layers, std::uint64_t act_bytes, std::int64_t fwd_ns,
                                 std::uint64_t w_bytes = 1 << 20) {
  WorkloadBuilder b;
  std::vector<BufferId> weights, acts;
  for (int i = 0; i < layers; ++i) weights.push_back(b.persistent("w" + std::to_string(i), w_bytes));
  const BufferId input = b.persistent("input", act_bytes);
  BufferId prev = input;
  for (int i = 0; i < layers; ++i) {
    prev = b.op("fwd" + std::to_string(i), fwd_ns, {prev, weights[i]}, {act_bytes})[0];
    acts.push_back(prev);
  }
  BufferId grad = b.op("loss", fwd_ns / 4 + 1, {prev}, {act_bytes})[0];
  for (int i = layers - 1; i >= 0; --i) {
    const BufferId in = i > 0 ? acts[static_cast<std::size_t>(i - 1)] : input;
    const BufferId g = b.op("bwd" + std::to_string(i), 2 * fwd_ns, {grad, in, weights[i]}, {act_bytes})[0];
    b.free(grad);
    b.free(acts[static_cast<std::size_t>(i)]);
    grad = g;
  }
  b.op("step", fwd_ns / 4 + 1, {grad});
  b.free(grad);
  return b.take();
}

}  // namespace delta::policy::testing
