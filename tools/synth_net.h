// Layers for synthetic training iterations, with a tape for their backward pass: each forward
// layer writes its op(s) to a SynthGraph and, when an input needs a gradient, records what its
// backward pass does (the ops PyTorch's autograd runs for it, reading what PyTorch saves);
// backward() replays the tape in reverse, summing gradients where a tensor feeds several ops
// (a new tensor for activations; in place, as AccumulateGrad does, for parameters); the
// optimizer steps update parameters and their state in place (MUTATE). Every op is timed by the
// cost model of a named GPU (gpu_cost_model.h): FLOPs over its peak for convolutions and matrix
// products, bytes over its HBM bandwidth for the rest; ops that make views launch no kernel and
// are logged at 1 µs. Tensors are fp32 (4 bytes) unless said (indices int64, masks bool).
// Offline code.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>
#include <vector>

#include "tools/gpu_cost_model.h"
#include "tools/synth_graph.h"

namespace delta::tools {

enum class Optimizer : std::uint8_t { kSgdMomentum, kAdam };

class SynthNet {
 public:
  SynthNet(SynthGraph& graph, const GpuSpec& gpu) : g_(graph), gpu_(gpu) {}

  // Constants. A parameter belongs to a group (one network, one optimizer); its optimizer
  // state (momentum, or Adam's two moments) is created with it.
  int group(Optimizer optimizer);
  TensorId param(int group, std::string_view label, SynthShape shape);
  TensorId input(std::string_view label, SynthShape shape, std::uint32_t elem_bytes = 4);
  // A frozen group's parameters get no gradients (ops compute only what flows through them).
  void freeze(int group, bool frozen);

  // Layers. Shapes: images [N, C, H, W]; matrices [rows, cols].
  TensorId conv2d(TensorId x, TensorId w, int stride, std::string_view label);  // "same" padding
  // A transposed convolution, stride 2 (w [Cin, Cout, k, k]): doubles the side.
  TensorId convTranspose2d(TensorId x, TensorId w, std::string_view label);
  TensorId batchNorm(TensorId x, TensorId gamma, TensorId beta, std::string_view label);
  TensorId relu(TensorId x, std::string_view label);
  TensorId leakyRelu(TensorId x, std::string_view label);
  TensorId tanh(TensorId x, std::string_view label);
  TensorId gelu(TensorId x, std::string_view label);
  // a + b; b either a's shape or the trailing rows of a broadcast over the leading ones.
  TensorId add(TensorId a, TensorId b, std::string_view label);
  TensorId cat(const std::vector<TensorId>& xs, std::string_view label);  // along channels
  TensorId maxPool(TensorId x, int stride, std::string_view label);       // same padding
  TensorId upsample2(TensorId x, std::string_view label);                  // nearest, x2
  TensorId globalAvgPool(TensorId x, std::string_view label);              // -> [N, C]
  TensorId linear(TensorId x, TensorId w, TensorId b, std::string_view label);  // x·w + b
  TensorId layerNorm(TensorId x, TensorId gamma, TensorId beta, std::string_view label);
  TensorId embedding(TensorId table, TensorId ids, std::string_view label);
  // Attention: qkv [B·L, 3·h·dh] split into q, k, v [B·h, L, dh] (views); q·kᵀ; p·v; the
  // context back to [B·L, h·dh] (a copy).
  std::vector<TensorId> splitHeads(TensorId qkv, std::int64_t batch, std::int64_t len,
                                   std::int64_t heads, std::string_view label);
  TensorId bmmNT(TensorId a, TensorId b, std::string_view label);  // a·bᵀ
  TensorId bmmNN(TensorId a, TensorId b, std::string_view label);  // a·b
  TensorId softmax(TensorId x, std::string_view label);            // over the last dimension
  TensorId dropout(TensorId x, std::string_view label);
  TensorId mergeHeads(TensorId ctx, std::int64_t batch, std::int64_t len, std::string_view label);
  // Tree-LSTM cells (fused elementwise kernels): a leaf from its gates [n, 3H] (i, o, u); an
  // internal node from its gates [B, 5H] (i, o, u, f_left, f_right) and its children's cells.
  std::pair<TensorId, TensorId> leafCell(TensorId gates, std::string_view label);
  std::pair<TensorId, TensorId> treeCell(TensorId gates, TensorId c_left, TensorId c_right,
                                         std::string_view label);
  // x [n·B, F] as n views [B, F] (unbind); their gradients are stacked back.
  std::vector<TensorId> unbindRows(TensorId x, std::int64_t n, std::string_view label);
  TensorId detach(TensorId x);
  TensorId reshape(TensorId x, SynthShape shape, std::string_view label);  // a view
  // Losses: a scalar. Cross entropy over dimension 1 (log_softmax + nll_loss).
  TensorId crossEntropy(TensorId logits, TensorId target, std::string_view label);
  TensorId bceWithLogits(TensorId logit, TensorId target, std::string_view label);

  // The tape: backward(loss, mark) runs the backward of every layer recorded since `mark`
  // (the most recent first) and forgets them.
  std::size_t mark() const { return tape_.size(); }
  void backward(TensorId loss, std::size_t mark = 0);
  // One optimizer step over the group's parameters that have a gradient; the gradients die.
  void step(int group);

  SynthGraph& graph() { return g_; }
  const SynthShape& shape(TensorId t) const { return g_.tensor(t).shape; }

 private:
  struct Param {
    TensorId tensor;
    std::vector<TensorId> state;  // the optimizer's
  };
  struct Group {
    Optimizer optimizer;
    bool frozen = false;
    std::vector<Param> params;
  };
  // An op timed by the cost model from its arguments' and results' shapes, or from
  // `cost_inputs` when the kernel reads them in another layout (a transposed operand).
  std::vector<TensorId> op(std::string_view name, const std::vector<TensorId>& args,
                           const std::vector<SynthGraph::Result>& results,
                           const std::vector<SynthShape>& cost_inputs = {});
  TensorId op1(std::string_view name, const std::vector<TensorId>& args, const SynthGraph::Result& result,
               const std::vector<SynthShape>& cost_inputs = {}) {
    return op(name, args, {result}, cost_inputs)[0];
  }
  // Batch and layer norm: the output and two statistics (`stats`, named as ATen names them);
  // the backward (`backward`, given `backward_args` after the output's gradient: the input, the
  // statistics and the affine parameters, indices into {x, gamma, beta, stat 1, stat 2}) gives
  // the gradients of what needs one.
  struct Normalization {
    std::string_view forward, backward;
    std::string_view stat_names[2];
    SynthShape stats;
    std::vector<int> backward_args;
  };
  TensorId normalization(const Normalization& n, TensorId x, TensorId gamma, TensorId beta, std::string_view label);
  // y = f(x) elementwise; its backward reads the gradient and y (saves_output) or x.
  TensorId elementwise(TensorId x, std::string_view forward, std::string_view backward, bool saves_output,
                       std::string_view label);
  std::int64_t timeOf(std::string_view name, const std::vector<OpTensor>& in, const std::vector<OpTensor>& out) const;
  OpTensor costTensor(TensorId t) const;

  bool requiresGrad(TensorId t) const;
  void setRequiresGrad(TensorId t, bool r);
  TensorId gradOf(TensorId t) const { return t < grad_.size() ? grad_[t] : kNoTensor; }
  void accumulate(TensorId x, TensorId g);
  void record(std::function<void()> backward) { tape_.push_back(std::move(backward)); }

  SynthGraph& g_;
  GpuSpec gpu_;
  std::vector<Group> groups_;
  std::vector<std::int32_t> group_of_;  // per tensor: its parameter group, -1 if none
  std::vector<bool> requires_;          // per tensor
  std::vector<TensorId> grad_;          // per tensor
  std::vector<std::function<void()>> tape_;
};

}  // namespace delta::tools
