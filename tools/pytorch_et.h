// Imports a PyTorch Execution Trace (JSON, schema 1.0.x or 1.1.x, gzip or plain; see
// docs/pytorch-traces.md) as a Workload of one iteration:
// - buffers are CUDA storages: views share their storage; a storage id that an op returns
//   without having received it is a fresh allocation (PyTorch reuses ids with addresses), so one
//   id can stand for several buffers in turn; each lives from its first use to its last;
// - ops are the outermost nodes that touch CUDA storage (their children are part of them:
//   counted once); the storages their subtree reads, writes in place and creates are theirs;
// - with several iterations (ProfilerStep# nodes, else each Optimizer.step ends one) the last
//   complete one is replayed; storages alive across its ends, or never created in the trace
//   (parameters, inputs, optimizer state), are persistent;
// - durations come from a paired Kineto trace (kineto_join.h) when given, else from the cost
//   model of a named GPU (gpu_cost_model.h); what an op that is a pure function of its inputs
//   makes is recomputable at the op's duration (plus that of an in-place op on it alone that
//   follows before any other use: relu_ after batch norm);
// - the batch is the leading dimension of most activation bytes; buffers with that leading
//   dimension (not shaped like a parameter) and the ops that touch them scale with the batch.
// Offline code.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "policy/dtr_log_reader.h"

namespace delta::tools {

struct EtTensorRef {
  std::uint64_t storage = 0;
  std::uint64_t offset = 0;  // elements
  std::uint64_t numel = 0;
  std::uint32_t elem_bytes = 0;
  bool cuda = false;
  std::uint32_t arg = 0;  // the argument it came from
  std::vector<std::int64_t> shape;
};

struct EtNode {
  std::int64_t id = 0;
  std::int64_t parent = -1;
  std::int64_t tid = 0;
  std::string name;
  std::string schema;  // op_schema, may be empty
  std::vector<EtTensorRef> inputs;
  std::vector<EtTensorRef> outputs;
  std::vector<std::size_t> children;  // indices into EtTrace::nodes, by id
};

struct EtTrace {
  std::string schema;
  std::vector<EtNode> nodes;  // by id
  std::vector<std::size_t> roots;
};

// `et` parsed into nodes; empty on success, else a one-line reason naming `name`.
std::string parseEt(const nlohmann::json& et, const std::string& name, EtTrace& out);

struct EtImportOptions {
  std::string kineto_path;  // empty: the cost model
  std::string gpu;          // empty: kDefaultGpu (cost model only)
};

struct EtImport {
  policy::Workload workload;
  std::string error;               // empty on success
  std::vector<std::string> notes;  // what was inferred and how well the Kineto trace joined
  std::size_t iterations = 0;      // found in the trace
  std::int64_t batch = 0;          // 0: none found
  double kineto_coverage = -1;     // share of the iteration's GPU time joined to ops; -1: none
  std::int64_t profiled_gpu_ns = 0;
};

EtImport importPyTorchEt(const std::string& path, const EtImportOptions& options);
// The same from text in memory (tests); `kineto_text` empty for the cost model.
EtImport importPyTorchEtText(const std::string& et_text, const std::string& kineto_text,
                             const EtImportOptions& options, const std::string& name);

}  // namespace delta::tools
