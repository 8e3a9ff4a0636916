// Joins a Kineto trace (torch.profiler's Chrome trace-event JSON) to an Execution Trace recorded
// by the same process, to time the ET's ops by their GPU kernels:
// - ET nodes to Kineto CPU ops: per thread, the ET's node names in id (start) order are aligned
//   with a Kineto thread's CPU ops in start order (a Kineto trace may hold many iterations and
//   ids differ between the two files, so names and order are what they share); the ET's largest
//   thread is placed first, the others near it in time;
// - kernels (and GPU memcpy/memset) to CPU ops: through the `correlation` of the CUDA runtime
//   call that launched them, to the innermost joined CPU op around that call on its thread;
// - an op's time is the GPU time of the kernels of its subtree; the iteration's GPU time is that
//   of every kernel launched between its first and last joined op, joined or not.
// Offline code.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "tools/pytorch_et.h"

namespace delta::tools {

struct KinetoJoin {
  std::vector<std::int64_t> op_gpu_ns;   // per op of the iteration
  std::vector<std::size_t> op_kernels;
  std::vector<bool> op_matched;          // some node of its subtree was found in the profile
  std::size_t et_nodes = 0;              // ET nodes that could be joined (not thread roots)
  std::size_t matched_nodes = 0;
  std::int64_t window_gpu_ns = 0;        // every kernel launched within the iteration
  std::int64_t joined_gpu_ns = 0;        // those joined to an op of the iteration
  std::size_t window_kernels = 0;
  std::size_t unjoined_kernels = 0;

  double coverage() const {
    return window_gpu_ns > 0 ? static_cast<double>(joined_gpu_ns) / static_cast<double>(window_gpu_ns) : 0.0;
  }
};

// `op_of_node[i]`: the iteration's op (0..ops-1) that ET node i belongs to, or -1.
std::string joinKineto(const EtTrace& trace, const std::vector<std::int64_t>& op_of_node, std::size_t ops,
                       const nlohmann::json& kineto, const std::string& name, KinetoJoin& out);

}  // namespace delta::tools
