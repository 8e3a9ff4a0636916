// Roofline cost model per op: see gpu_cost_model.h.
#include "tools/gpu_cost_model.h"

#include <algorithm>
#include <cmath>

namespace delta::tools {

namespace {

// Achieved shares of the data-sheet peaks: large convolutions and GEMMs reach about 60 % of the
// peak and streaming kernels about 70 % of the bandwidth on these parts; a kernel that does
// almost nothing still occupies the GPU for a few microseconds.
constexpr double kComputeEfficiency = 0.6;
constexpr double kBandwidthEfficiency = 0.7;
constexpr std::int64_t kMinKernelNs = 2000;

// Ops that make a view, change metadata or allocate without writing: no kernel of their own.
constexpr std::string_view kFreeOps[] = {
    "aten::view", "aten::_reshape_alias", "aten::reshape", "aten::as_strided", "aten::expand",
    "aten::t", "aten::transpose", "aten::permute", "aten::squeeze", "aten::unsqueeze",
    "aten::detach", "aten::detach_", "detach", "detach_", "aten::alias", "aten::empty",
    "aten::empty_like", "aten::empty_strided", "aten::slice", "aten::select", "aten::flatten",
    "aten::lift_fresh", "aten::set_", "aten::resize_", "aten::unflatten", "aten::split",
    "aten::chunk", "aten::narrow", "aten::unbind", "aten::numpy_T", "aten::contiguous",
    "aten::to", "aten::_unsafe_view", "aten::view_as", "aten::expand_as", "aten::resolve_conj",
    "aten::resolve_neg", "aten::result_type", "aten::is_nonzero", "aten::size", "aten::stride"};

bool isConvForward(std::string_view n) {
  return n == "aten::conv1d" || n == "aten::conv2d" || n == "aten::conv3d" ||
         n == "aten::convolution" || n == "aten::_convolution" || n == "aten::cudnn_convolution" ||
         n == "aten::miopen_convolution" || n == "aten::mkldnn_convolution";
}
bool isConvBackward(std::string_view n) {
  return n == "aten::convolution_backward" || n.starts_with("aten::cudnn_convolution_backward");
}
bool isMatmul(std::string_view n) {
  return n == "aten::mm" || n == "aten::addmm" || n == "aten::bmm" || n == "aten::baddbmm" ||
         n == "aten::linear";
}
bool isAttention(std::string_view n) {
  return n.starts_with("aten::scaled_dot_product") || n.starts_with("aten::_scaled_dot_product") ||
         n.starts_with("aten::_flash_attention") || n.starts_with("aten::_efficient_attention");
}

double product(const std::vector<std::int64_t>& shape, std::size_t from, std::size_t to) {
  double p = 1;
  for (std::size_t i = from; i < to && i < shape.size(); ++i) p *= static_cast<double>(std::max<std::int64_t>(shape[i], 0));
  return p;
}

// The CUDA tensors among an op's arguments, of rank at least `rank`, in order.
std::vector<const OpTensor*> tensorsOfRank(const std::vector<OpTensor>& v, std::size_t rank) {
  std::vector<const OpTensor*> out;
  for (const OpTensor& t : v) {
    if (t.shape.size() >= rank) out.push_back(&t);
  }
  return out;
}

// FLOPs of one convolution: every output element is a dot product over (input channels per
// group) x kernel window.
double convFlops(const OpTensor& weight, const OpTensor& output) {
  const double out_elems = product(output.shape, 0, output.shape.size());
  const double per_output = product(weight.shape, 1, weight.shape.size());
  return 2.0 * out_elems * per_output;
}

double flopsOf(const OpCall& op) {
  const std::string_view n = op.name;
  if (isConvForward(n)) {
    const auto in = tensorsOfRank(*op.inputs, 3);
    const auto out = tensorsOfRank(*op.outputs, 3);
    if (in.size() < 2 || out.empty()) return 0;
    return convFlops(*in[1], *out[0]);
  }
  if (isConvBackward(n)) {
    // (grad_output, input, weight) in; grad_input and grad_weight each cost one forward.
    const auto in = tensorsOfRank(*op.inputs, 3);
    if (in.size() < 3) return 0;
    const double forward = convFlops(*in[2], *in[0]);
    const auto out = tensorsOfRank(*op.outputs, 3);
    return forward * static_cast<double>(std::max<std::size_t>(out.size(), 1));
  }
  if (isMatmul(n)) {
    const auto in = tensorsOfRank(*op.inputs, 2);
    if (n == "aten::linear") {
      if (in.size() < 2) return 0;
      const auto& x = in[0]->shape;
      const auto& w = in[1]->shape;  // [out, in]
      return 2.0 * product(x, 0, x.size()) * static_cast<double>(w[0]);
    }
    // addmm/baddbmm put the bias first; the two operands are the last two matrices.
    if (in.size() < 2) return 0;
    const auto& a = in[in.size() - 2]->shape;
    const auto& b = in[in.size() - 1]->shape;
    if (a.size() < 2 || b.size() < 2) return 0;
    const double batch = product(a, 0, a.size() - 2);
    return 2.0 * batch * static_cast<double>(a[a.size() - 2]) * static_cast<double>(a.back()) *
           static_cast<double>(b.back());
  }
  if (isAttention(n)) {
    // q [.., L, E], k [.., S, E], v [.., S, Ev]: Q·Kᵀ and P·V; a backward pass does twice that.
    const auto in = tensorsOfRank(*op.inputs, 3);
    if (in.size() < 3) return 0;
    const auto& q = in[0]->shape;
    const auto& k = in[1]->shape;
    const auto& v = in[2]->shape;
    const double forward = 2.0 * product(q, 0, q.size() - 2) * static_cast<double>(q[q.size() - 2]) *
                           static_cast<double>(k[k.size() - 2]) * static_cast<double>(q.back() + v.back());
    return n.find("backward") != std::string_view::npos ? 2.0 * forward : forward;
  }
  return 0;
}

double peakTflops(const GpuSpec& gpu, std::uint32_t elem_bytes) {
  if (elem_bytes >= 8) return gpu.fp64_tflops;
  if (elem_bytes == 4) return gpu.fp32_tflops;
  return gpu.fp16_tflops;
}

}  // namespace

const std::vector<GpuSpec>& gpuSpecs() {
  // Data sheets (URLs in docs/pytorch-traces.md): SXM parts, dense (no sparsity) figures.
  static const std::vector<GpuSpec> specs = {
      {"v100-16gb", "NVIDIA V100 SXM2 16GB", 7.8, 15.7, 125.0, 900.0, 16.0},
      {"a100-40gb", "NVIDIA A100 SXM4 40GB", 9.7, 19.5, 312.0, 1555.0, 40.0},
      {"h100-80gb", "NVIDIA H100 SXM5 80GB", 34.0, 67.0, 989.0, 3350.0, 80.0},
      {"h200", "NVIDIA H200 SXM 141GB", 34.0, 67.0, 989.0, 4800.0, 141.0},
  };
  return specs;
}

std::optional<GpuSpec> findGpu(std::string_view name) {
  for (const GpuSpec& g : gpuSpecs()) {
    if (g.name == name) return g;
  }
  return std::nullopt;
}

std::string gpuNames() {
  std::string s;
  for (const GpuSpec& g : gpuSpecs()) s += (s.empty() ? "" : ", ") + std::string(g.name);
  return s;
}

bool isFlopsOp(std::string_view name) {
  return isConvForward(name) || isConvBackward(name) || isMatmul(name) || isAttention(name);
}

OpCost estimateOp(const OpCall& op, const GpuSpec& gpu) {
  OpCost c;
  for (std::string_view free_op : kFreeOps) {
    if (op.name == free_op) return c;
  }
  std::uint32_t elem_bytes = 4;
  for (const auto* list : {op.inputs, op.outputs}) {
    for (const OpTensor& t : *list) {
      if (!t.cuda) continue;
      c.bytes += static_cast<double>(t.numel) * t.elem_bytes;
      if (t.shape.size() >= 2) elem_bytes = t.elem_bytes;
    }
  }
  if (isFlopsOp(op.name)) {
    c.flops = flopsOf(op);
    c.kind = CostKind::kFlops;
  } else if (c.bytes > 0) {
    c.kind = CostKind::kBytes;
  } else {
    return c;
  }
  const double compute_ns = c.flops / (peakTflops(gpu, elem_bytes) * 1e3 * kComputeEfficiency);
  const double memory_ns = c.bytes / (gpu.hbm_gbps * kBandwidthEfficiency);
  const double ns = std::max(compute_ns, memory_ns);
  c.ns = std::max<std::int64_t>(kMinKernelNs, std::isfinite(ns) ? std::llround(std::min(ns, 1e15)) : 0);
  return c;
}

}  // namespace delta::tools
