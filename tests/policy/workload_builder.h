// Test helper: builds small Workloads by hand, a synthetic training iteration (a forward chain
// whose activations are kept for a backward pass that walks it in reverse), and seeded random
// ones (training iterations of random sizes and times, random graphs).
#pragma once

#include <algorithm>
#include <random>
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

inline constexpr std::uint64_t kMiB = 1u << 20;

// A training iteration with random layer sizes and times: forward ops keep their activations
// for the backward pass, which frees them in reverse.
inline Workload randomTraining(std::mt19937& rng, int layers) {
  WorkloadBuilder b;
  std::uniform_int_distribution<int> mib(2, 24);
  std::uniform_int_distribution<int> us(50, 2000);
  std::vector<BufferId> weights, acts;
  for (int i = 0; i < layers; ++i) weights.push_back(b.persistent("w" + std::to_string(i), mib(rng) * kMiB / 4));
  BufferId prev = b.persistent("input", static_cast<std::uint64_t>(mib(rng)) * kMiB);
  const BufferId input = prev;
  for (int i = 0; i < layers; ++i) {
    prev = b.op("fwd" + std::to_string(i), us(rng) * 1000, {prev, weights[i]},
                {static_cast<std::uint64_t>(mib(rng)) * kMiB})[0];
    acts.push_back(prev);
  }
  BufferId grad = b.op("loss", us(rng) * 1000, {prev}, {static_cast<std::uint64_t>(mib(rng)) * kMiB})[0];
  for (int i = layers - 1; i >= 0; --i) {
    const BufferId in = i > 0 ? acts[static_cast<std::size_t>(i - 1)] : input;
    const BufferId g = b.op("bwd" + std::to_string(i), us(rng) * 1000, {grad, in, weights[i]},
                            {static_cast<std::uint64_t>(mib(rng)) * kMiB})[0];
    b.free(grad);
    b.free(acts[static_cast<std::size_t>(i)]);
    grad = g;
  }
  b.op("step", us(rng) * 100, {grad}, {}, {weights[0]});
  b.free(grad);
  return b.take();
}

// A random graph: each op reads up to three live buffers, makes up to two (some without a
// hook), and with `write_percent` chance writes one in place; buffers are freed after their
// last use.
inline Workload randomGraph(std::mt19937& rng, int ops, int write_percent = 10) {
  std::uniform_int_distribution<int> mib(1, 32);
  std::uniform_int_distribution<int> us(20, 3000);
  std::uniform_int_distribution<int> percent(0, 99);
  Workload w;
  auto add = [&](bool persistent, std::int32_t producer, std::int64_t cost) {
    w.buffers.push_back({"b" + std::to_string(w.buffers.size()), static_cast<std::uint64_t>(mib(rng)) * kMiB,
                         persistent, producer, cost});
    return static_cast<BufferId>(w.buffers.size() - 1);
  };
  std::vector<BufferId> live;
  for (int i = 0; i < 2; ++i) live.push_back(add(true, -1, kUnknownNs));
  for (int i = 0; i < ops; ++i) {
    WorkloadOp op;
    op.name = "op" + std::to_string(i);
    op.compute_ns = us(rng) * 1000;
    const int reads = 1 + percent(rng) % 3;
    for (int r = 0; r < reads; ++r) {
      const BufferId b = live[static_cast<std::size_t>(percent(rng)) % live.size()];
      if (std::find(op.reads.begin(), op.reads.end(), b) == op.reads.end()) op.reads.push_back(b);
    }
    if (percent(rng) < write_percent) {
      const BufferId b = live[static_cast<std::size_t>(percent(rng)) % live.size()];
      if (std::find(op.reads.begin(), op.reads.end(), b) == op.reads.end()) op.writes.push_back(b);
    }
    const int results = i + 1 == ops ? 0 : 1 + (percent(rng) < 25);
    for (int r = 0; r < results; ++r) {
      const bool hook = percent(rng) < 80;
      op.allocs.push_back(add(false, i, hook ? op.compute_ns : kUnknownNs));
      live.push_back(op.allocs.back());
    }
    w.ops.push_back(std::move(op));
  }
  // Frees after the last use (a workload frees what it allocates within the iteration).
  std::vector<int> last_use(w.buffers.size(), -1);
  for (std::size_t i = 0; i < w.ops.size(); ++i) {
    for (const auto* list : {&w.ops[i].allocs, &w.ops[i].reads, &w.ops[i].writes}) {
      for (BufferId b : *list) last_use[b] = static_cast<int>(i);
    }
  }
  for (BufferId b = 0; b < w.buffers.size(); ++b) {
    if (!w.buffers[b].persistent) w.ops[static_cast<std::size_t>(last_use[b])].frees.push_back(b);
  }
  return w;
}

}  // namespace delta::policy::testing
