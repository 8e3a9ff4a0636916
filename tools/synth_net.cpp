// Layers with a backward tape for synthetic iterations: see synth_net.h.
#include "tools/synth_net.h"

#include <fmt/core.h>

#include <algorithm>
#include <cassert>
#include <string>

namespace delta::tools {

namespace {

// An op that only makes a view launches no kernel; the prototype logged such ops at about a
// microsecond of host time.
constexpr std::int64_t kViewNs = 1000;
constexpr std::uint32_t kF32 = 4;
constexpr std::uint32_t kI64 = 8;
constexpr std::uint32_t kBool = 1;

SynthShape transposed(SynthShape s) {
  if (s.size() >= 2) std::swap(s[s.size() - 1], s[s.size() - 2]);
  return s;
}

bool isView(std::string_view name) {
  return name == "detach" || name == "view" || name == "unbind" || name == "split_with_sizes";
}

}  // namespace

int SynthNet::group(Optimizer optimizer) {
  groups_.push_back({optimizer, false, {}});
  return static_cast<int>(groups_.size() - 1);
}

TensorId SynthNet::param(int group, std::string_view label, SynthShape shape) {
  const TensorId p = g_.constant(label, shape, kF32);
  if (group_of_.size() <= p) group_of_.resize(p + 1, -1);
  group_of_[p] = group;
  Group& grp = groups_[static_cast<std::size_t>(group)];
  // The optimizer's state for it: momentum, or Adam's first and second moments.
  const std::string l(label);
  Param entry{p, {}};
  if (grp.optimizer == Optimizer::kSgdMomentum) {
    entry.state.push_back(g_.constant(l + ".momentum", shape, kF32));
  } else {
    entry.state.push_back(g_.constant(l + ".exp_avg", shape, kF32));
    entry.state.push_back(g_.constant(l + ".exp_avg_sq", shape, kF32));
  }
  grp.params.push_back(std::move(entry));
  return p;
}

TensorId SynthNet::input(std::string_view label, SynthShape shape, std::uint32_t elem_bytes) {
  return g_.constant(label, std::move(shape), elem_bytes);
}

void SynthNet::freeze(int group, bool frozen) { groups_[static_cast<std::size_t>(group)].frozen = frozen; }

bool SynthNet::requiresGrad(TensorId t) const {
  if (t < group_of_.size() && group_of_[t] >= 0) return !groups_[static_cast<std::size_t>(group_of_[t])].frozen;
  return t < requires_.size() && requires_[t];
}

void SynthNet::setRequiresGrad(TensorId t, bool r) {
  if (requires_.size() <= t) requires_.resize(t + 1, false);
  requires_[t] = r;
}

OpTensor SynthNet::costTensor(TensorId t) const {
  const SynthTensor& s = g_.tensor(t);
  return {s.shape, s.numel(), s.elem_bytes, true};
}

std::int64_t SynthNet::timeOf(std::string_view name, const std::vector<OpTensor>& in,
                              const std::vector<OpTensor>& out) const {
  if (isView(name)) return kViewNs;
  const std::string aten = "aten::" + std::string(name);
  const OpCost c = estimateOp({aten, &in, &out}, gpu_);
  return std::max<std::int64_t>(c.ns, kViewNs);
}

std::vector<TensorId> SynthNet::op(std::string_view name, const std::vector<TensorId>& args,
                                   const std::vector<SynthGraph::Result>& results,
                                   const std::vector<SynthShape>& cost_inputs) {
  std::vector<OpTensor> in;
  std::vector<OpTensor> out;
  if (cost_inputs.empty()) {
    for (TensorId a : args) in.push_back(costTensor(a));
  } else {
    for (const SynthShape& s : cost_inputs) {
      std::uint64_t n = 1;
      for (std::int64_t d : s) n *= static_cast<std::uint64_t>(d);
      in.push_back({s, n, kF32, true});
    }
  }
  for (const SynthGraph::Result& r : results) {
    std::uint64_t n = 1;
    for (std::int64_t d : r.shape) n *= static_cast<std::uint64_t>(d);
    // A view writes nothing.
    if (r.alias < 0) out.push_back({r.shape, n, r.elem_bytes, true});
  }
  return g_.call(name, args, results, timeOf(name, in, out));
}

void SynthNet::accumulate(TensorId x, TensorId gx) {
  if (gx == kNoTensor || !requiresGrad(x)) return;
  if (grad_.size() <= x) grad_.resize(x + 1, kNoTensor);
  const TensorId old = grad_[x];
  if (old == kNoTensor) {
    grad_[x] = gx;
    return;
  }
  if (x < group_of_.size() && group_of_[x] >= 0) {
    // A parameter's .grad is summed in place.
    const std::vector<OpTensor> in{costTensor(old), costTensor(gx)};
    const std::vector<OpTensor> out{costTensor(old)};
    g_.mutate("add_", {old, gx}, {0}, timeOf("add_", in, out));
    return;
  }
  grad_[x] = op1("add", {old, gx}, {"grad", shape(x)});
}

// --- layers -------------------------------------------------------------------------------

TensorId SynthNet::conv2d(TensorId x, TensorId w, int stride, std::string_view label) {
  const SynthShape& xs = shape(x);
  const SynthShape& ws = shape(w);
  const SynthShape ys{xs[0], ws[0], xs[2] / stride, xs[3] / stride};
  const TensorId y = op1("convolution", {x, w}, {label, ys});
  const bool gx = requiresGrad(x);
  const bool gw = requiresGrad(w);
  setRequiresGrad(y, gx || gw);
  if (gx || gw) {
    record([=, this] {
      const TensorId gy = gradOf(y);
      if (gy == kNoTensor) return;
      std::vector<SynthGraph::Result> rs;
      if (gx) rs.push_back({"grad", shape(x)});
      if (gw) rs.push_back({"grad", shape(w)});
      const std::vector<TensorId> g = op("convolution_backward", {gy, x, w}, rs);
      if (gx) accumulate(x, g[0]);
      if (gw) accumulate(w, g[gx ? 1 : 0]);
    });
  }
  return y;
}

TensorId SynthNet::convTranspose2d(TensorId x, TensorId w, std::string_view label) {
  const SynthShape& xs = shape(x);
  const SynthShape& ws = shape(w);
  const SynthShape ys{xs[0], ws[1], xs[2] * 2, xs[3] * 2};
  // ATen runs it as a convolution (transposed): every input element meets Cout·k² weights, the
  // FLOPs of the forward convolution whose output is shaped like x.
  auto shaped = [](const SynthShape& s) {
    std::uint64_t n = 1;
    for (std::int64_t d : s) n *= static_cast<std::uint64_t>(d);
    return OpTensor{s, n, kF32, true};
  };
  const std::int64_t ns = timeOf("convolution", {shaped(ys), costTensor(w)}, {shaped(xs)});
  const TensorId y = g_.call1("convolution", {x, w}, {label, ys}, ns);
  const bool gx = requiresGrad(x);
  const bool gw = requiresGrad(w);
  setRequiresGrad(y, gx || gw);
  if (gx || gw) {
    record([=, this] {
      const TensorId gy = gradOf(y);
      if (gy == kNoTensor) return;
      std::vector<SynthGraph::Result> rs;
      if (gx) rs.push_back({"grad", shape(x)});
      if (gw) rs.push_back({"grad", shape(w)});
      const std::vector<TensorId> g = op("convolution_backward", {gy, x, w}, rs, {shape(x), shape(gy), shape(w)});
      if (gx) accumulate(x, g[0]);
      if (gw) accumulate(w, g[gx ? 1 : 0]);
    });
  }
  return y;
}

TensorId SynthNet::batchNorm(TensorId x, TensorId gamma, TensorId beta, std::string_view label) {
  return normalization({"native_batch_norm", "native_batch_norm_backward", {"save_mean", "save_invstd"},
                        SynthShape{shape(x)[1]}, {0, 1, 3, 4}},
                       x, gamma, beta, label);
}

TensorId SynthNet::normalization(const Normalization& n, TensorId x, TensorId gamma, TensorId beta,
                                 std::string_view label) {
  const std::vector<TensorId> r =
      op(n.forward, {x, gamma, beta}, {{label, shape(x)}, {n.stat_names[0], n.stats}, {n.stat_names[1], n.stats}});
  const bool gx = requiresGrad(x);
  const bool gp = requiresGrad(gamma);
  setRequiresGrad(r[0], gx || gp);
  if (gx || gp) {
    const std::string backward(n.backward);
    const std::vector<int> backward_args = n.backward_args;
    record([=, this] {
      const TensorId gy = gradOf(r[0]);
      if (gy == kNoTensor) return;
      std::vector<SynthGraph::Result> rs;
      if (gx) rs.push_back({"grad", shape(x)});
      if (gp) {
        rs.push_back({"grad", shape(gamma)});
        rs.push_back({"grad", shape(beta)});
      }
      const TensorId saved[] = {x, gamma, beta, r[1], r[2]};
      std::vector<TensorId> args{gy};
      for (int i : backward_args) args.push_back(saved[i]);
      const std::vector<TensorId> g = op(backward, args, rs);
      if (gx) accumulate(x, g[0]);
      if (gp) {
        accumulate(gamma, g[gx ? 1 : 0]);
        accumulate(beta, g[gx ? 2 : 1]);
      }
    });
  }
  return r[0];
}

TensorId SynthNet::elementwise(TensorId x, std::string_view forward, std::string_view backward, bool saves_output,
                               std::string_view label) {
  const TensorId y = op1(forward, {x}, {label, shape(x)});
  if (!requiresGrad(x)) return y;
  setRequiresGrad(y, true);
  const std::string backward_name(backward);
  record([=, this] {
    const TensorId gy = gradOf(y);
    if (gy == kNoTensor) return;
    accumulate(x, op1(backward_name, {gy, saves_output ? y : x}, {"grad", shape(x)}));
  });
  return y;
}

// What each backward reads besides the gradient: relu, tanh and softmax their output, leaky
// relu and gelu their input.
TensorId SynthNet::relu(TensorId x, std::string_view label) {
  return elementwise(x, "relu", "threshold_backward", true, label);
}
TensorId SynthNet::leakyRelu(TensorId x, std::string_view label) {
  return elementwise(x, "leaky_relu", "leaky_relu_backward", false, label);
}
TensorId SynthNet::tanh(TensorId x, std::string_view label) {
  return elementwise(x, "tanh", "tanh_backward", true, label);
}
TensorId SynthNet::gelu(TensorId x, std::string_view label) {
  return elementwise(x, "gelu", "gelu_backward", false, label);
}
TensorId SynthNet::softmax(TensorId x, std::string_view label) {
  return elementwise(x, "_softmax", "_softmax_backward_data", true, label);
}

TensorId SynthNet::add(TensorId a, TensorId b, std::string_view label) {
  const TensorId y = op1("add", {a, b}, {label, shape(a)});
  const bool ga = requiresGrad(a);
  const bool gb = requiresGrad(b);
  setRequiresGrad(y, ga || gb);
  if (ga || gb) {
    const bool broadcast = shape(b) != shape(a);
    record([=, this] {
      const TensorId gy = gradOf(y);
      if (gy == kNoTensor) return;
      if (ga) accumulate(a, gy);
      if (gb) accumulate(b, broadcast ? op1("sum", {gy}, {"grad", shape(b)}) : gy);
    });
  }
  return y;
}

TensorId SynthNet::cat(const std::vector<TensorId>& xs, std::string_view label) {
  SynthShape ys = shape(xs[0]);
  ys[1] = 0;
  bool any = false;
  for (TensorId x : xs) {
    ys[1] += shape(x)[1];
    any = any || requiresGrad(x);
  }
  const TensorId y = op1("cat", xs, {label, ys});
  setRequiresGrad(y, any);
  if (any) {
    record([=, this] {
      const TensorId gy = gradOf(y);
      if (gy == kNoTensor) return;
      // The gradient of each input is a slice of the output's (views).
      std::vector<SynthGraph::Result> rs;
      for (TensorId x : xs) rs.push_back({"grad", shape(x), kF32, 0});
      const std::vector<TensorId> g = op("split_with_sizes", {gy}, rs);
      for (std::size_t i = 0; i < xs.size(); ++i) accumulate(xs[i], g[i]);
    });
  }
  return y;
}

TensorId SynthNet::maxPool(TensorId x, int stride, std::string_view label) {
  SynthShape ys = shape(x);
  ys[2] /= stride;
  ys[3] /= stride;
  const std::vector<TensorId> r = op("max_pool2d_with_indices", {x}, {{label, ys}, {"indices", ys, kI64}});
  if (!requiresGrad(x)) return r[0];
  setRequiresGrad(r[0], true);
  record([=, this] {
    const TensorId gy = gradOf(r[0]);
    if (gy == kNoTensor) return;
    accumulate(x, op1("max_pool2d_with_indices_backward", {gy, x, r[1]}, {"grad", shape(x)}));
  });
  return r[0];
}

TensorId SynthNet::upsample2(TensorId x, std::string_view label) {
  SynthShape ys = shape(x);
  ys[2] *= 2;
  ys[3] *= 2;
  const TensorId y = op1("upsample_nearest2d", {x}, {label, ys});
  if (!requiresGrad(x)) return y;
  setRequiresGrad(y, true);
  record([=, this] {
    const TensorId gy = gradOf(y);
    if (gy == kNoTensor) return;
    accumulate(x, op1("upsample_nearest2d_backward", {gy}, {"grad", shape(x)}));
  });
  return y;
}

TensorId SynthNet::globalAvgPool(TensorId x, std::string_view label) {
  const TensorId y = op1("adaptive_avg_pool2d", {x}, {label, {shape(x)[0], shape(x)[1]}});
  if (!requiresGrad(x)) return y;
  setRequiresGrad(y, true);
  record([=, this] {
    const TensorId gy = gradOf(y);
    if (gy == kNoTensor) return;
    // PyTorch saves the input for its sizes: it stays alive until here.
    accumulate(x, op1("adaptive_avg_pool2d_backward", {gy, x}, {"grad", shape(x)}));
  });
  return y;
}

TensorId SynthNet::linear(TensorId x, TensorId w, TensorId b, std::string_view label) {
  const SynthShape& xs = shape(x);
  const SynthShape& ws = shape(w);
  const TensorId y = op1("addmm", {b, x, w}, {label, {xs[0], ws[1]}});
  const bool gx = requiresGrad(x);
  const bool gw = requiresGrad(w);
  setRequiresGrad(y, gx || gw);
  if (gx || gw) {
    record([=, this] {
      const TensorId gy = gradOf(y);
      if (gy == kNoTensor) return;
      if (gx) accumulate(x, op1("mm", {gy, w}, {"grad", shape(x)}, {shape(gy), transposed(shape(w))}));
      if (gw) {
        accumulate(w, op1("mm", {x, gy}, {"grad", shape(w)}, {transposed(shape(x)), shape(gy)}));
        accumulate(b, op1("sum", {gy}, {"grad", shape(b)}));
      }
    });
  }
  return y;
}

TensorId SynthNet::layerNorm(TensorId x, TensorId gamma, TensorId beta, std::string_view label) {
  return normalization({"native_layer_norm", "native_layer_norm_backward", {"mean", "rstd"},
                        SynthShape{shape(x)[0], 1}, {0, 3, 4, 1, 2}},
                       x, gamma, beta, label);
}

TensorId SynthNet::embedding(TensorId table, TensorId ids, std::string_view label) {
  const SynthShape ys{shape(ids)[0], shape(table)[1]};
  // It reads one row of the table per id, not the whole table.
  const TensorId y = op1("embedding", {table, ids}, {label, ys}, {ys, shape(ids)});
  if (!requiresGrad(table)) return y;
  setRequiresGrad(y, true);
  record([=, this] {
    const TensorId gy = gradOf(y);
    if (gy == kNoTensor) return;
    accumulate(table, op1("embedding_dense_backward", {gy, ids}, {"grad", shape(table)}));
  });
  return y;
}

std::vector<TensorId> SynthNet::splitHeads(TensorId qkv, std::int64_t batch, std::int64_t len,
                                           std::int64_t heads, std::string_view label) {
  const std::int64_t dh = shape(qkv)[1] / 3 / heads;
  const SynthShape hs{batch * heads, len, dh};
  const std::string l(label);
  const std::vector<TensorId> r =
      op("unbind", {qkv}, {{l + ".q", hs, kF32, 0}, {l + ".k", hs, kF32, 0}, {l + ".v", hs, kF32, 0}});
  if (!requiresGrad(qkv)) return r;
  for (TensorId t : r) setRequiresGrad(t, true);
  record([=, this] {
    std::vector<TensorId> gs;
    for (TensorId t : r) {
      if (gradOf(t) != kNoTensor) gs.push_back(gradOf(t));
    }
    if (gs.empty()) return;
    accumulate(qkv, op1("stack", gs, {"grad", shape(qkv)}));
  });
  return r;
}

TensorId SynthNet::bmmNT(TensorId a, TensorId b, std::string_view label) {
  const SynthShape& as = shape(a);
  const TensorId y = op1("bmm", {a, b}, {label, {as[0], as[1], shape(b)[1]}}, {as, transposed(shape(b))});
  const bool ga = requiresGrad(a);
  const bool gb = requiresGrad(b);
  setRequiresGrad(y, ga || gb);
  if (ga || gb) {
    record([=, this] {
      const TensorId gy = gradOf(y);
      if (gy == kNoTensor) return;
      // y = a·bᵀ: da = dy·b, db = dyᵀ·a.
      if (ga) accumulate(a, op1("bmm", {gy, b}, {"grad", shape(a)}));
      if (gb) accumulate(b, op1("bmm", {gy, a}, {"grad", shape(b)}, {transposed(shape(gy)), shape(a)}));
    });
  }
  return y;
}

TensorId SynthNet::bmmNN(TensorId a, TensorId b, std::string_view label) {
  const SynthShape& as = shape(a);
  const TensorId y = op1("bmm", {a, b}, {label, {as[0], as[1], shape(b)[2]}});
  const bool ga = requiresGrad(a);
  const bool gb = requiresGrad(b);
  setRequiresGrad(y, ga || gb);
  if (ga || gb) {
    record([=, this] {
      const TensorId gy = gradOf(y);
      if (gy == kNoTensor) return;
      // y = a·b: da = dy·bᵀ, db = aᵀ·dy.
      if (ga) accumulate(a, op1("bmm", {gy, b}, {"grad", shape(a)}, {shape(gy), transposed(shape(b))}));
      if (gb) accumulate(b, op1("bmm", {a, gy}, {"grad", shape(b)}, {transposed(shape(a)), shape(gy)}));
    });
  }
  return y;
}

TensorId SynthNet::dropout(TensorId x, std::string_view label) {
  const std::vector<TensorId> r = op("native_dropout", {x}, {{label, shape(x)}, {"mask", shape(x), kBool}});
  if (!requiresGrad(x)) return r[0];
  setRequiresGrad(r[0], true);
  record([=, this] {
    const TensorId gy = gradOf(r[0]);
    if (gy == kNoTensor) return;
    accumulate(x, op1("native_dropout_backward", {gy, r[1]}, {"grad", shape(x)}));
  });
  return r[0];
}

TensorId SynthNet::mergeHeads(TensorId ctx, std::int64_t batch, std::int64_t len, std::string_view label) {
  const SynthShape& cs = shape(ctx);
  const std::int64_t width = cs[0] / batch * cs[2];
  const TensorId y = op1("clone", {ctx}, {label, {batch * len, width}});
  if (!requiresGrad(ctx)) return y;
  setRequiresGrad(y, true);
  record([=, this] {
    const TensorId gy = gradOf(y);
    if (gy == kNoTensor) return;
    accumulate(ctx, op1("clone", {gy}, {"grad", shape(ctx)}));
  });
  return y;
}

std::pair<TensorId, TensorId> SynthNet::leafCell(TensorId gates, std::string_view label) {
  const SynthShape hs{shape(gates)[0], shape(gates)[1] / 3};
  const std::string l(label);
  const std::vector<TensorId> r = op("leaf_lstm_cell", {gates}, {{l + ".h", hs}, {l + ".c", hs}});
  if (!requiresGrad(gates)) return {r[0], r[1]};
  setRequiresGrad(r[0], true);
  setRequiresGrad(r[1], true);
  record([=, this] {
    std::vector<TensorId> args;
    for (TensorId t : r) {
      if (gradOf(t) != kNoTensor) args.push_back(gradOf(t));
    }
    if (args.empty()) return;
    args.push_back(gates);
    args.push_back(r[1]);
    accumulate(gates, op1("leaf_lstm_cell_backward", args, {"grad", shape(gates)}));
  });
  return {r[0], r[1]};
}

std::pair<TensorId, TensorId> SynthNet::treeCell(TensorId gates, TensorId c_left, TensorId c_right,
                                                 std::string_view label) {
  const SynthShape hs{shape(gates)[0], shape(gates)[1] / 5};
  const std::string l(label);
  const std::vector<TensorId> r =
      op("tree_lstm_cell", {gates, c_left, c_right}, {{l + ".h", hs}, {l + ".c", hs}});
  const bool any = requiresGrad(gates) || requiresGrad(c_left) || requiresGrad(c_right);
  if (!any) return {r[0], r[1]};
  setRequiresGrad(r[0], true);
  setRequiresGrad(r[1], true);
  record([=, this] {
    std::vector<TensorId> args;
    for (TensorId t : r) {
      if (gradOf(t) != kNoTensor) args.push_back(gradOf(t));
    }
    if (args.empty()) return;
    args.insert(args.end(), {gates, c_left, c_right, r[1]});
    const std::vector<TensorId> g = op("tree_lstm_cell_backward", args,
                                       {{"grad", shape(gates)}, {"grad", shape(c_left)}, {"grad", shape(c_right)}});
    accumulate(gates, g[0]);
    accumulate(c_left, g[1]);
    accumulate(c_right, g[2]);
  });
  return {r[0], r[1]};
}

std::vector<TensorId> SynthNet::unbindRows(TensorId x, std::int64_t n, std::string_view label) {
  const SynthShape rs{shape(x)[0] / n, shape(x)[1]};
  std::vector<SynthGraph::Result> results;
  const std::uint32_t elem = g_.tensor(x).elem_bytes;
  std::vector<std::string> labels;
  labels.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) labels.push_back(fmt::format("{}{}", label, i));
  for (const std::string& l : labels) results.push_back({l, rs, elem, 0});
  const std::vector<TensorId> r = op("unbind", {x}, results);
  if (!requiresGrad(x)) return r;
  for (TensorId t : r) setRequiresGrad(t, true);
  record([=, this] {
    std::vector<TensorId> gs;
    for (TensorId t : r) {
      if (gradOf(t) != kNoTensor) gs.push_back(gradOf(t));
    }
    if (gs.empty()) return;
    accumulate(x, op1("stack", gs, {"grad", shape(x)}));
  });
  return r;
}

TensorId SynthNet::detach(TensorId x) { return op1("detach", {x}, {"detached", shape(x), g_.tensor(x).elem_bytes, 0}); }

TensorId SynthNet::reshape(TensorId x, SynthShape shape_to, std::string_view label) {
  const TensorId y = op1("view", {x}, {label, std::move(shape_to), g_.tensor(x).elem_bytes, 0});
  if (!requiresGrad(x)) return y;
  setRequiresGrad(y, true);
  record([=, this] {
    const TensorId gy = gradOf(y);
    if (gy == kNoTensor) return;
    accumulate(x, op1("view", {gy}, {"grad", shape(x), kF32, 0}));
  });
  return y;
}

TensorId SynthNet::crossEntropy(TensorId logits, TensorId target, std::string_view label) {
  const bool image = shape(logits).size() == 4;
  const std::string l(label);
  const TensorId lp = op1("_log_softmax", {logits}, {l + ".log_probs", shape(logits)});
  const std::vector<TensorId> r = op(image ? "nll_loss2d_forward" : "nll_loss_forward", {lp, target},
                                     {{l, {}}, {"total_weight", {}}});
  if (!requiresGrad(logits)) return r[0];
  setRequiresGrad(lp, true);
  setRequiresGrad(r[0], true);
  record([=, this] {
    const TensorId gl = gradOf(r[0]);
    if (gl == kNoTensor) return;
    const TensorId glp =
        op1(image ? "nll_loss2d_backward" : "nll_loss_backward", {gl, lp, target, r[1]}, {"grad", shape(lp)});
    accumulate(logits, op1("_log_softmax_backward_data", {glp, lp}, {"grad", shape(logits)}));
  });
  return r[0];
}

TensorId SynthNet::bceWithLogits(TensorId logit, TensorId target, std::string_view label) {
  const TensorId loss = op1("binary_cross_entropy_with_logits", {logit, target}, {label, {}});
  if (!requiresGrad(logit)) return loss;
  setRequiresGrad(loss, true);
  record([=, this] {
    const TensorId gl = gradOf(loss);
    if (gl == kNoTensor) return;
    accumulate(logit,
               op1("binary_cross_entropy_with_logits_backward", {gl, logit, target}, {"grad", shape(logit)}));
  });
  return loss;
}

// --- backward and the optimizer -------------------------------------------------------------

void SynthNet::backward(TensorId loss, std::size_t mark) {
  assert(mark <= tape_.size());
  if (grad_.size() <= loss) grad_.resize(loss + 1, kNoTensor);
  grad_[loss] = op1("ones_like", {loss}, {"grad", shape(loss)});
  while (tape_.size() > mark) {
    // Pop first: a backward may record nothing, but must not see itself again.
    std::function<void()> f = std::move(tape_.back());
    tape_.pop_back();
    f();
  }
}

void SynthNet::step(int group) {
  const Group& grp = groups_[static_cast<std::size_t>(group)];
  for (const Param& param : grp.params) {
    const TensorId p = param.tensor;
    const TensorId gp = gradOf(p);
    if (gp == kNoTensor) continue;
    // sgd_(param, grad, momentum), adam_(param, grad, exp_avg, exp_avg_sq): all but the
    // gradient written.
    std::vector<TensorId> args{p, gp};
    std::vector<std::uint32_t> written{0};
    for (TensorId st : param.state) {
      written.push_back(static_cast<std::uint32_t>(args.size()));
      args.push_back(st);
    }
    const char* name = grp.optimizer == Optimizer::kAdam ? "adam_" : "sgd_";
    std::vector<OpTensor> in;
    std::vector<OpTensor> out;
    for (TensorId a : args) in.push_back(costTensor(a));
    for (std::uint32_t k : written) out.push_back(costTensor(args[k]));
    g_.mutate(name, args, written, timeOf(name, in, out));
    grad_[p] = kNoTensor;
  }
}

}  // namespace delta::tools
