// Synthetic workload families: see synth_workloads.h.
#include "tools/synth_workloads.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "policy/dtr_log_reader.h"
#include "tools/gpu_cost_model.h"
#include "tools/synth_net.h"

namespace delta::tools {

namespace {

// splitmix64 (Steele, Lea, Flood 2014): the same sequence on every platform, unlike the
// standard library's distributions.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi] (the modulo bias is negligible for these ranges).
  std::int64_t range(std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(hi - lo + 1));
  }
  template <typename T>
  T pick(std::initializer_list<T> values) {
    return values.begin()[next() % values.size()];
  }

 private:
  std::uint64_t s_;
};

std::uint64_t familySeed(std::string_view family, std::uint64_t seed) {
  std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a of the name
  for (char c : family) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h ^ (seed * 0x9e3779b97f4a7c15ULL);
}

struct Context {
  Rng rng;
  double scale;
  GpuSpec gpu;
  std::int64_t seq_len;
  std::vector<std::pair<std::string, std::int64_t>>* choices;

  std::int64_t chose(std::string name, std::int64_t v) {
    choices->emplace_back(std::move(name), v);
    return v;
  }
  // The seed's batch times the scale.
  std::int64_t batch(std::int64_t base) {
    return chose("batch", std::max<std::int64_t>(1, std::llround(static_cast<double>(base) * scale)));
  }
};

std::string at(std::string_view prefix, std::int64_t i) { return fmt::format("{}{}", prefix, i); }

// Tensors are named in the order they are made: a call never makes two of its arguments (the
// order C++ evaluates arguments in is the compiler's), so that every compiler writes the same
// log.

// conv 3x3 (or k x k) -> batch norm -> relu, parameters in `grp`.
TensorId convBnRelu(SynthNet& n, int grp, TensorId x, std::int64_t cout, int k, int stride, const std::string& l,
                    bool relu = true) {
  const std::int64_t cin = n.shape(x)[1];
  const TensorId w = n.param(grp, l + ".w", {cout, cin, k, k});
  const TensorId gamma = n.param(grp, l + ".bn.weight", {cout});
  const TensorId beta = n.param(grp, l + ".bn.bias", {cout});
  const TensorId y = n.batchNorm(n.conv2d(x, w, stride, l + ".conv"), gamma, beta, l + ".bn");
  return relu ? n.relu(y, l + ".relu") : y;
}

TensorId classifierHead(SynthNet& n, int grp, TensorId x, std::int64_t classes, TensorId target) {
  const TensorId pooled = n.globalAvgPool(x, "pool");
  const TensorId w = n.param(grp, "fc.w", {n.shape(pooled)[1], classes});
  const TensorId b = n.param(grp, "fc.b", {classes});
  return n.crossEntropy(n.linear(pooled, w, b, "fc"), target, "loss");
}

// --- unet -----------------------------------------------------------------------------------
// A U-Net for segmentation: encoder levels (two conv-bn-relu, then 2x2 max pool), a bottleneck,
// decoder levels (upsample, conv, concatenation with the encoder's output of the same level:
// the long skips, then two conv-bn-relu) and a 1x1 head to K classes per pixel. K is chosen so
// that the largest op (the log-softmax's backward over the logits: three tensors of
// B·K·H·W) has a working set of a quarter of the iteration's peak.
struct UnetShape {
  std::int64_t batch, levels, channels, side, classes;
};

void buildUnet(SynthNet& n, const UnetShape& s) {
  const int grp = n.group(Optimizer::kSgdMomentum);
  const TensorId image = n.input("image", {s.batch, 3, s.side, s.side});
  const TensorId target = n.input("target", {s.batch, s.side, s.side}, 8);
  std::vector<TensorId> skips;
  TensorId x = image;
  auto block = [&](TensorId in, std::int64_t c, const std::string& l) {
    return convBnRelu(n, grp, convBnRelu(n, grp, in, c, 3, 1, l + ".a"), c, 3, 1, l + ".b");
  };
  for (std::int64_t i = 0; i < s.levels; ++i) {
    x = block(x, s.channels << i, at("enc", i));
    skips.push_back(x);
    x = n.maxPool(x, 2, at("enc", i) + ".pool");
  }
  x = block(x, s.channels << s.levels, "mid");
  for (std::int64_t i = s.levels - 1; i >= 0; --i) {
    const std::string l = at("dec", i);
    const TensorId up = n.upsample2(x, l + ".up");
    const TensorId w = n.param(grp, l + ".up.w", {s.channels << i, n.shape(up)[1], 3, 3});
    const TensorId u = n.relu(n.conv2d(up, w, 1, l + ".upconv"), l + ".uprelu");
    x = block(n.cat({skips[static_cast<std::size_t>(i)], u}, l + ".cat"), s.channels << i, l);
  }
  const TensorId head = n.param(grp, "head.w", {s.classes, n.shape(x)[1], 1, 1});
  const TensorId loss = n.crossEntropy(n.conv2d(x, head, 1, "logits"), target, "loss");
  n.graph().annotate("BACKWARD");
  n.backward(loss);
  n.step(grp);
}

std::string unetLog(const UnetShape& s, const GpuSpec& gpu) {
  SynthGraph g;
  SynthNet n(g, gpu);
  buildUnet(n, s);
  return g.write();
}

double largestShare(const std::string& log) {
  const policy::ImportResult r = policy::parseDtrLog(log, "unet");
  if (!r.error.empty()) return 0;
  return static_cast<double>(largestWorkingSet(r.workload).first) / static_cast<double>(r.workload.peakBytes());
}

std::string unet(Context& c) {
  UnetShape s{};
  s.levels = c.chose("levels", c.rng.range(3, 5));
  s.channels = c.chose("channels", c.rng.pick<std::int64_t>({32, 48, 64}));
  s.side = c.chose("side", c.rng.pick<std::int64_t>({192, 256, 320}));
  s.batch = c.batch(c.rng.range(8, 16));
  // The share grows with K: the smallest K that reaches a quarter (bisection).
  constexpr double kShare = 0.25;
  std::int64_t lo = 1, hi = 8192;
  while (hi - lo > 1) {
    const std::int64_t mid = (lo + hi) / 2;
    s.classes = mid;
    (largestShare(unetLog(s, c.gpu)) >= kShare ? hi : lo) = mid;
  }
  s.classes = c.chose("classes", hi);
  return unetLog(s, c.gpu);
}

// --- gan ------------------------------------------------------------------------------------
// DCGAN, the loop of PyTorch's example: the generator's forward once, then the
// discriminator's step (real and detached fake images, backward, update D), then the
// generator's step (D on the fake with D frozen, backward through D into G, update G).
std::string gan(Context& c) {
  const std::int64_t stages = c.chose("stages", c.rng.range(5, 6));  // image side 4·2^stages
  const std::int64_t width = c.chose("width", c.rng.pick<std::int64_t>({64, 96}));
  const std::int64_t zdim = c.chose("zdim", c.rng.range(64, 256));
  const std::int64_t batch = c.batch(8 * c.rng.range(6, 16));
  const std::int64_t side = 4LL << stages;
  SynthGraph g;
  SynthNet n(g, c.gpu);
  const int gen = n.group(Optimizer::kAdam);
  const int dis = n.group(Optimizer::kAdam);
  const TensorId z = n.input("noise", {batch, zdim});
  const TensorId real = n.input("real", {batch, 3, side, side});
  const TensorId ones = n.input("label.real", {batch, 1});
  const TensorId zeros = n.input("label.fake", {batch, 1});

  // Generator: z -> [B, C0, 4, 4] -> (transposed conv stride 2, bn, relu) x stages, the last
  // one to 3 channels and tanh.
  const std::int64_t c0 = width << (stages - 1);
  const TensorId fcw = n.param(gen, "G.fc.w", {zdim, c0 * 16});
  const TensorId fcb = n.param(gen, "G.fc.b", {c0 * 16});
  TensorId x = n.reshape(n.linear(z, fcw, fcb, "G.fc"), {batch, c0, 4, 4}, "G.fc.view");
  const TensorId fc_gamma = n.param(gen, "G.fc.bn.weight", {c0});
  const TensorId fc_beta = n.param(gen, "G.fc.bn.bias", {c0});
  x = n.relu(n.batchNorm(x, fc_gamma, fc_beta, "G.fc.bn"), "G.fc.relu");
  for (std::int64_t i = 0; i < stages; ++i) {
    const std::string l = at("G.up", i);
    const bool last = i + 1 == stages;
    const std::int64_t cout = last ? 3 : c0 >> (i + 1);
    const TensorId w = n.param(gen, l + ".w", {n.shape(x)[1], cout, 4, 4});
    x = n.convTranspose2d(x, w, l + ".convt");
    if (last) {
      x = n.tanh(x, "G.image");
    } else {
      const TensorId gamma = n.param(gen, l + ".bn.weight", {cout});
      const TensorId beta = n.param(gen, l + ".bn.bias", {cout});
      x = n.relu(n.batchNorm(x, gamma, beta, l + ".bn"), l + ".relu");
    }
  }
  const TensorId fake = x;

  // Discriminator: (conv stride 2, bn except first, leaky relu) x stages -> linear -> logit.
  // Its parameters, made once and used by its three passes.
  struct DLayer {
    TensorId w, gamma = kNoTensor, beta = kNoTensor;
  };
  std::vector<DLayer> dl;
  std::int64_t cin = 3;
  for (std::int64_t i = 0; i < stages; ++i) {
    const std::string l = at("D.down", i);
    const std::int64_t cout = width << i;
    DLayer d{n.param(dis, l + ".w", {cout, cin, 3, 3})};
    if (i > 0) {
      d.gamma = n.param(dis, l + ".bn.weight", {cout});
      d.beta = n.param(dis, l + ".bn.bias", {cout});
    }
    dl.push_back(d);
    cin = cout;
  }
  const std::int64_t flat = cin * 16;
  const TensorId dfw = n.param(dis, "D.fc.w", {flat, 1});
  const TensorId dfb = n.param(dis, "D.fc.b", {1});
  auto discriminator = [&](TensorId img, const std::string& pass) {
    TensorId h = img;
    for (std::size_t i = 0; i < dl.size(); ++i) {
      const std::string l = at("D" + pass + ".down", static_cast<std::int64_t>(i));
      h = n.conv2d(h, dl[i].w, 2, l + ".conv");
      if (dl[i].gamma != kNoTensor) h = n.batchNorm(h, dl[i].gamma, dl[i].beta, l + ".bn");
      h = n.leakyRelu(h, l + ".lrelu");
    }
    h = n.reshape(h, {batch, flat}, "D" + pass + ".flat");
    return n.linear(h, dfw, dfb, "D" + pass + ".logit");
  };

  // The discriminator's step.
  const std::size_t d_mark = n.mark();
  const TensorId loss_real = n.bceWithLogits(discriminator(real, ".real"), ones, "D.loss.real");
  const TensorId loss_fake = n.bceWithLogits(discriminator(n.detach(fake), ".fake"), zeros, "D.loss.fake");
  const TensorId loss_d = n.add(loss_real, loss_fake, "D.loss");
  g.annotate("BACKWARD");
  n.backward(loss_d, d_mark);
  n.step(dis);
  // The generator's step: D (just updated) judges the same fake, frozen.
  n.freeze(dis, true);
  const TensorId loss_g = n.bceWithLogits(discriminator(fake, ".gen"), ones, "G.loss");
  g.annotate("BACKWARD");
  n.backward(loss_g);
  n.step(gen);
  n.freeze(dis, false);
  return g.write();
}

// --- tree-rnn -------------------------------------------------------------------------------
// A binary Tree-LSTM (Tai et al. 2015) over a batch of sentences parsed into the same random
// binary tree: the words embedded in one op, then one cell per leaf and one per internal node,
// children before parents (each node reads its two children's states and the shared recurrent
// weights), and a classifier on the root.
std::string treeRnn(Context& c) {
  const std::int64_t leaves = c.chose("leaves", c.rng.range(32, 96));
  const std::int64_t hidden = c.chose("hidden", c.rng.pick<std::int64_t>({768, 1024, 1536}));
  const std::int64_t batch = c.batch(64 * c.rng.range(4, 16));
  constexpr std::int64_t kVocab = 20000;
  constexpr std::int64_t kClasses = 5;
  // The tree: merge a random adjacent pair until one node is left (leaves stay in order).
  std::vector<std::pair<std::int64_t, std::int64_t>> merges;  // children, by node index
  std::vector<std::int64_t> frontier;
  for (std::int64_t i = 0; i < leaves; ++i) frontier.push_back(i);
  std::vector<std::int64_t> depth(static_cast<std::size_t>(leaves), 0);
  std::int64_t next = leaves;
  while (frontier.size() > 1) {
    const auto k = static_cast<std::size_t>(c.rng.range(0, static_cast<std::int64_t>(frontier.size()) - 2));
    merges.emplace_back(frontier[k], frontier[k + 1]);
    depth.push_back(1 + std::max(depth[static_cast<std::size_t>(frontier[k])],
                                 depth[static_cast<std::size_t>(frontier[k + 1])]));
    frontier[k] = next++;
    frontier.erase(frontier.begin() + static_cast<std::ptrdiff_t>(k) + 1);
  }
  c.chose("depth", depth.back());

  SynthGraph g;
  SynthNet n(g, c.gpu);
  const int grp = n.group(Optimizer::kAdam);
  const TensorId ids = n.input("tokens", {leaves * batch}, 8);
  const TensorId target = n.input("target", {batch}, 8);
  const TensorId table = n.param(grp, "embedding", {kVocab, hidden});
  const TensorId wl = n.param(grp, "leaf.w", {hidden, 3 * hidden});
  const TensorId bl = n.param(grp, "leaf.b", {3 * hidden});
  const TensorId w = n.param(grp, "node.w", {2 * hidden, 5 * hidden});
  const TensorId b = n.param(grp, "node.b", {5 * hidden});
  const TensorId wc = n.param(grp, "classifier.w", {hidden, kClasses});
  const TensorId bc = n.param(grp, "classifier.b", {kClasses});

  // The sentence's words embedded at once; then each leaf on its own, as each internal node.
  const std::vector<TensorId> words = n.unbindRows(n.embedding(table, ids, "embed"), leaves, "word");
  std::vector<TensorId> h, cs;
  for (std::int64_t i = 0; i < leaves; ++i) {
    const std::string l = at("leaf", i);
    const auto [hl, cl] = n.leafCell(n.linear(words[static_cast<std::size_t>(i)], wl, bl, l + ".gates"), l);
    h.push_back(hl);
    cs.push_back(cl);
  }
  for (std::size_t m = 0; m < merges.size(); ++m) {
    const auto [left, right] = merges[m];
    const std::string l = at("node", leaves + static_cast<std::int64_t>(m));
    const TensorId hc = n.cat({h[static_cast<std::size_t>(left)], h[static_cast<std::size_t>(right)]}, l + ".children");
    const auto [hn, cn] = n.treeCell(n.linear(hc, w, b, l + ".gates"), cs[static_cast<std::size_t>(left)],
                                     cs[static_cast<std::size_t>(right)], l);
    h.push_back(hn);
    cs.push_back(cn);
  }
  const TensorId loss = n.crossEntropy(n.linear(h.back(), wc, bc, "logits"), target, "loss");
  g.annotate("BACKWARD");
  n.backward(loss);
  n.step(grp);
  return g.write();
}

// --- wide-branches --------------------------------------------------------------------------
// Inception-style: a strided stem, then stages of blocks whose 4-8 parallel branches (1x1;
// 1x1 then 3x3; 1x1 then two 3x3; 3x3 max pool then 1x1) are joined by concatenation; max
// pool between stages; a classifier.
std::string wideBranches(Context& c) {
  const std::int64_t side = c.chose("side", c.rng.pick<std::int64_t>({128, 160, 224}));
  const std::int64_t stages = c.chose("stages", c.rng.range(2, 3));
  const std::int64_t blocks = c.chose("blocks_per_stage", c.rng.range(2, 3));
  const std::int64_t width = c.chose("branch_width", c.rng.pick<std::int64_t>({64, 96, 128}));
  const std::int64_t batch = c.batch(8 * c.rng.range(4, 8));
  SynthGraph g;
  SynthNet n(g, c.gpu);
  const int grp = n.group(Optimizer::kSgdMomentum);
  const TensorId image = n.input("image", {batch, 3, side, side});
  const TensorId target = n.input("target", {batch}, 8);
  TensorId x = n.maxPool(convBnRelu(n, grp, image, 64, 3, 2, "stem"), 2, "stem.pool");
  std::int64_t max_branches = 0;
  for (std::int64_t s = 0; s < stages; ++s) {
    if (s > 0) x = n.maxPool(x, 2, at("pool", s));
    const std::int64_t wd = width << s;
    for (std::int64_t blk = 0; blk < blocks; ++blk) {
      const std::string l = fmt::format("s{}.b{}", s, blk);
      const std::int64_t branches = c.rng.range(4, 8);
      max_branches = std::max(max_branches, branches);
      std::vector<TensorId> outs;
      for (std::int64_t j = 0; j < branches; ++j) {
        const std::string bl = at(l + ".br", j);
        switch (c.rng.range(0, 3)) {
          case 0:
            outs.push_back(convBnRelu(n, grp, x, wd, 1, 1, bl + ".1x1"));
            break;
          case 1: {
            const TensorId r = convBnRelu(n, grp, x, wd / 2, 1, 1, bl + ".reduce");
            outs.push_back(convBnRelu(n, grp, r, wd, 3, 1, bl + ".3x3"));
            break;
          }
          case 2: {
            const TensorId r = convBnRelu(n, grp, x, wd / 2, 1, 1, bl + ".reduce");
            outs.push_back(convBnRelu(n, grp, convBnRelu(n, grp, r, wd, 3, 1, bl + ".3x3a"), wd, 3, 1, bl + ".3x3b"));
            break;
          }
          default:
            outs.push_back(convBnRelu(n, grp, n.maxPool(x, 1, bl + ".pool"), wd, 1, 1, bl + ".proj"));
            break;
        }
      }
      x = n.cat(outs, l + ".cat");
    }
  }
  c.chose("max_branches", max_branches);
  const TensorId loss = classifierHead(n, grp, x, 1000, target);
  g.annotate("BACKWARD");
  n.backward(loss);
  n.step(grp);
  return g.write();
}

// --- deep-residual --------------------------------------------------------------------------
// A ResNet of basic blocks (conv-bn-relu-conv-bn, plus the shortcut, relu), 3-4 stages that
// halve the side and double the width (a 1x1 strided projection on the first shortcut), 4-12
// blocks per stage.
std::string deepResidual(Context& c) {
  const std::int64_t side = c.chose("side", c.rng.pick<std::int64_t>({96, 128}));
  const std::int64_t width = c.chose("width", c.rng.pick<std::int64_t>({32, 48, 64}));
  const std::int64_t stages = c.chose("stages", c.rng.range(3, 4));
  const std::int64_t batch = c.batch(8 * c.rng.range(4, 8));
  SynthGraph g;
  SynthNet n(g, c.gpu);
  const int grp = n.group(Optimizer::kSgdMomentum);
  const TensorId image = n.input("image", {batch, 3, side, side});
  const TensorId target = n.input("target", {batch}, 8);
  TensorId x = convBnRelu(n, grp, image, width, 3, 1, "stem");
  std::int64_t total = 0;
  for (std::int64_t s = 0; s < stages; ++s) {
    const std::int64_t blocks = c.chose(at("blocks", s), c.rng.range(4, 12));
    total += blocks;
    for (std::int64_t blk = 0; blk < blocks; ++blk) {
      const std::string l = fmt::format("s{}.b{}", s, blk);
      const int stride = s > 0 && blk == 0 ? 2 : 1;
      const std::int64_t wd = width << s;
      TensorId shortcut = x;
      if (stride == 2) shortcut = convBnRelu(n, grp, x, wd, 1, 2, l + ".proj", false);
      const TensorId a = convBnRelu(n, grp, x, wd, 3, stride, l + ".a");
      const TensorId bb = convBnRelu(n, grp, a, wd, 3, 1, l + ".b", false);
      x = n.relu(n.add(bb, shortcut, l + ".add"), l + ".out");
    }
  }
  c.chose("blocks", total);
  const TensorId loss = classifierHead(n, grp, x, 1000, target);
  g.annotate("BACKWARD");
  n.backward(loss);
  n.step(grp);
  return g.write();
}

// --- attention ------------------------------------------------------------------------------
// A pre-norm Transformer encoder trained as a language model, attention written out as
// PyTorch's eager code runs it: q·kᵀ, softmax, dropout and p·v each keep a [B·h, L, L]
// tensor (the softmax's output, the dropout's mask and output are saved for the backward),
// so that activations grow with the square of the sequence length.
std::string attention(Context& c) {
  const std::int64_t layers = c.chose("layers", c.rng.range(4, 12));
  const std::int64_t model = c.chose("model", c.rng.pick<std::int64_t>({512, 768, 1024}));
  const std::int64_t heads = c.chose("heads", model / 64);
  std::int64_t len = c.rng.pick<std::int64_t>({512, 768, 1024, 1536, 2048});
  if (c.seq_len > 0) len = c.seq_len;
  c.chose("seq_len", len);
  const std::int64_t vocab = c.chose("vocab", c.rng.pick<std::int64_t>({8192, 16384, 32768}));
  const std::int64_t batch = c.batch(c.rng.range(2, 8));
  const std::int64_t tokens = batch * len;
  SynthGraph g;
  SynthNet n(g, c.gpu);
  const int grp = n.group(Optimizer::kAdam);
  const TensorId ids = n.input("tokens", {tokens}, 8);
  const TensorId target = n.input("target", {tokens}, 8);
  const TensorId table = n.param(grp, "embedding", {vocab, model});
  const TensorId pos = n.param(grp, "position", {len, model});
  TensorId x = n.add(n.embedding(table, ids, "embed"), pos, "embed.pos");
  auto norm = [&](TensorId in, const std::string& l) {
    const TensorId gamma = n.param(grp, l + ".weight", {model});
    const TensorId beta = n.param(grp, l + ".bias", {model});
    return n.layerNorm(in, gamma, beta, l);
  };
  auto dense = [&](TensorId in, std::int64_t out, const std::string& l) {
    const TensorId w = n.param(grp, l + ".w", {n.shape(in)[1], out});
    const TensorId b = n.param(grp, l + ".b", {out});
    return n.linear(in, w, b, l);
  };
  for (std::int64_t i = 0; i < layers; ++i) {
    const std::string l = at("layer", i);
    const TensorId qkv = dense(norm(x, l + ".ln1"), 3 * model, l + ".qkv");
    const std::vector<TensorId> h = n.splitHeads(qkv, batch, len, heads, l);
    const TensorId scores = n.bmmNT(h[0], h[1], l + ".scores");
    const TensorId probs = n.dropout(n.softmax(scores, l + ".probs"), l + ".probs.dropout");
    const TensorId ctx = n.mergeHeads(n.bmmNN(probs, h[2], l + ".context"), batch, len, l + ".merge");
    x = n.add(x, dense(ctx, model, l + ".out"), l + ".residual1");
    const TensorId f = n.gelu(dense(norm(x, l + ".ln2"), 4 * model, l + ".ffn1"), l + ".gelu");
    x = n.add(x, dense(f, model, l + ".ffn2"), l + ".residual2");
  }
  const TensorId logits = dense(norm(x, "ln_f"), vocab, "lm_head");
  const TensorId loss = n.crossEntropy(logits, target, "loss");
  g.annotate("BACKWARD");
  n.backward(loss);
  n.step(grp);
  return g.write();
}

struct Family {
  SynthFamily info;
  std::string (*build)(Context&);
};

const std::vector<Family>& families() {
  static const std::vector<Family> f = {
      {{"unet", "encoder-decoder with long skip connections; one op's working set is 25 % of the peak"}, unet},
      {{"gan", "generator and discriminator trained in alternation (two parameter sets, two steps)"}, gan},
      {{"tree-rnn", "Tree-LSTM: one cell per node of a random binary tree, shared weights"}, treeRnn},
      {{"wide-branches", "Inception-style blocks of 4-8 parallel branches joined by concatenation"}, wideBranches},
      {{"deep-residual", "ResNet of 12-48 basic blocks: long chains of identity shortcuts"}, deepResidual},
      {{"attention", "Transformer encoder whose attention activations grow with the square of the sequence"},
       attention},
  };
  return f;
}

}  // namespace

const std::vector<SynthFamily>& synthFamilies() {
  static const std::vector<SynthFamily> f = [] {
    std::vector<SynthFamily> v;
    for (const Family& x : families()) v.push_back(x.info);
    return v;
  }();
  return f;
}

std::string synthFamilyNames() {
  std::string s;
  for (const SynthFamily& f : synthFamilies()) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

std::int64_t SynthResult::choice(std::string_view name) const {
  for (const auto& [n, v] : choices) {
    if (n == name) return v;
  }
  return -1;
}

std::pair<std::uint64_t, std::size_t> largestWorkingSet(const policy::Workload& w) {
  std::pair<std::uint64_t, std::size_t> best{0, 0};
  for (std::size_t i = 0; i < w.ops.size(); ++i) {
    std::uint64_t bytes = 0;
    for (policy::BufferId id : w.ops[i].workingSet()) bytes += w.buffers[id].bytes;
    if (bytes > best.first) best = {bytes, i};
  }
  return best;
}

SynthResult synthesize(const SynthOptions& options) {
  SynthResult r;
  const Family* family = nullptr;
  for (const Family& f : families()) {
    if (f.info.name == options.family) family = &f;
  }
  if (family == nullptr) {
    r.error = "unknown family '" + options.family + "' (known: " + synthFamilyNames() + ")";
    return r;
  }
  const std::optional<GpuSpec> gpu = findGpu(options.gpu.empty() ? kDefaultGpu : std::string_view(options.gpu));
  if (!gpu) {
    r.error = "unknown GPU '" + options.gpu + "' (known: " + gpuNames() + ")";
    return r;
  }
  if (!(options.scale > 0) || !std::isfinite(options.scale)) {
    r.error = "the scale must be a positive number";
    return r;
  }
  Context c{Rng(familySeed(family->info.name, options.seed)), options.scale, *gpu, options.seq_len, &r.choices};
  r.log = family->build(c);
  return r;
}

}  // namespace delta::tools
