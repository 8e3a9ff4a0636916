// A cost model for PyTorch ops on a named GPU, for Execution Traces recorded without a Kineto
// profile: a roofline per op. Convolutions, matrix products and attention are timed by their
// FLOPs (from the op and its shapes) at a share of the GPU's peak for the element type; every
// other op by the bytes its CUDA tensors hold (read and written once) at a share of the HBM
// bandwidth; an op that launches work costs at least one kernel launch. Peaks come from the
// vendors' data sheets (docs/pytorch-traces.md cites them). Offline code.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace delta::tools {

struct GpuSpec {
  std::string_view name;      // --gpu NAME
  std::string_view label;     // the product, as its data sheet names it
  double fp64_tflops;
  double fp32_tflops;         // CUDA cores, no tensor cores
  double fp16_tflops;         // dense FP16/BF16 on tensor cores
  double hbm_gbps;            // GB/s
  double memory_gib;
};

const std::vector<GpuSpec>& gpuSpecs();
std::optional<GpuSpec> findGpu(std::string_view name);
std::string gpuNames();  // "v100-16gb, a100-40gb, ..." for messages
constexpr std::string_view kDefaultGpu = "a100-40gb";

// One tensor argument of an op as the cost model sees it.
struct OpTensor {
  std::vector<std::int64_t> shape;
  std::uint64_t numel = 0;
  std::uint32_t elem_bytes = 0;
  bool cuda = false;
};

struct OpCall {
  std::string_view name;  // "aten::mm"
  const std::vector<OpTensor>* inputs;
  const std::vector<OpTensor>* outputs;
};

enum class CostKind : std::uint8_t { kFlops, kBytes, kFree };

struct OpCost {
  CostKind kind = CostKind::kFree;
  double flops = 0;
  double bytes = 0;
  std::int64_t ns = 0;
};

// The op's own cost; kFree for ops that only make views or allocate (no kernel).
OpCost estimateOp(const OpCall& op, const GpuSpec& gpu);
// True for op names whose cost the FLOPs rule covers (the children of such an op are not
// added again).
bool isFlopsOp(std::string_view name);

}  // namespace delta::tools
