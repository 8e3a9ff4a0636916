// PyTorch Execution Trace importer: see pytorch_et.h.
#include "tools/pytorch_et.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

#include "tools/gpu_cost_model.h"
#include "tools/json_document.h"
#include "tools/kineto_join.h"

namespace delta::tools {

namespace {

using nlohmann::json;
using policy::BufferId;
using policy::kUnknownNs;
using policy::Workload;
using policy::WorkloadBuffer;
using policy::WorkloadOp;

// Bounds on what a tensor may claim: far above any real GPU, far below overflow.
constexpr std::uint64_t kMaxElements = 1ull << 48;
constexpr std::uint32_t kMaxElementBytes = 64;
constexpr std::size_t kMaxValueDepth = 8;
constexpr std::size_t kMaxTextBytes = std::size_t{1} << 30;

bool isTensorValue(const json& v) {
  if (!v.is_array() || v.size() != 6 || !v[5].is_string()) return false;
  for (std::size_t i = 0; i < 5; ++i) {
    if (!v[i].is_number()) return false;
  }
  return true;
}

std::string tensorFrom(const json& v, const json* shape, std::uint32_t arg, EtTensorRef& t) {
  std::int64_t f[5] = {};
  for (std::size_t i = 0; i < 5; ++i) {
    if (!asInt(v[i], f[i]) || f[i] < 0) {
      return "a tensor whose field " + std::to_string(i) + " is not a non-negative integer: " + v.dump();
    }
  }
  t.storage = static_cast<std::uint64_t>(f[1]);
  t.offset = static_cast<std::uint64_t>(f[2]);
  t.numel = static_cast<std::uint64_t>(f[3]);
  if (t.offset > kMaxElements || t.numel > kMaxElements || f[4] > kMaxElementBytes) {
    return "a tensor of absurd size (offset " + std::to_string(f[2]) + ", " + std::to_string(f[3]) +
           " elements of " + std::to_string(f[4]) + " bytes)";
  }
  t.elem_bytes = static_cast<std::uint32_t>(f[4]);
  const std::string& device = v[5].get_ref<const std::string&>();
  t.cuda = device.starts_with("cuda");
  t.arg = arg;
  if (shape != nullptr && shape->is_array()) {
    for (const json& d : *shape) {
      std::int64_t x = 0;
      if (!asInt(d, x)) {  // not a flat shape: leave it unknown
        t.shape.clear();
        break;
      }
      t.shape.push_back(x);
    }
  }
  return {};
}

// Tensors of one argument: a tensor, or lists (of lists) of them, with shapes alongside.
std::string collectTensors(const json& v, const json* shape, std::uint32_t arg, std::size_t depth,
                           std::vector<EtTensorRef>& out) {
  if (isTensorValue(v)) {
    EtTensorRef t;
    if (std::string err = tensorFrom(v, shape, arg, t); !err.empty()) return err;
    out.push_back(std::move(t));
    return {};
  }
  if (!v.is_array()) return {};
  if (depth >= kMaxValueDepth) return "argument lists nested deeper than " + std::to_string(kMaxValueDepth);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const json* s = shape != nullptr && shape->is_array() && i < shape->size() ? &(*shape)[i] : nullptr;
    if (std::string err = collectTensors(v[i], s, arg, depth + 1, out); !err.empty()) return err;
  }
  return {};
}

// Schema 1.0.x keeps `inputs`/`input_shapes`; 1.1.x keeps `inputs: {values, shapes, types}`.
std::string argumentsOf(const json& node, const char* which, std::vector<EtTensorRef>& out) {
  const json* args = member(node, which);
  if (args == nullptr) return {};
  const json* values = args;
  const json* shapes = member(node, which == std::string_view("inputs") ? "input_shapes" : "output_shapes");
  if (args->is_object()) {
    values = member(*args, "values");
    shapes = member(*args, "shapes");
    if (values == nullptr) return {};
  }
  if (!values->is_array()) return std::string("\"") + which + "\" is not a list";
  for (std::size_t i = 0; i < values->size(); ++i) {
    const json* s = shapes != nullptr && shapes->is_array() && i < shapes->size() ? &(*shapes)[i] : nullptr;
    if (std::string err = collectTensors((*values)[i], s, static_cast<std::uint32_t>(i), 0, out); !err.empty()) {
      return err;
    }
  }
  return {};
}

// 1.0.x keeps tid and op_schema at the top of a node; 1.1.x in `attrs: [{name, type, value}]`.
const json* attribute(const json& node, const char* key) {
  if (const json* v = member(node, key)) return v;
  const json* attrs = member(node, "attrs");
  if (attrs == nullptr || !attrs->is_array()) return nullptr;
  for (const json& a : *attrs) {
    const json* n = member(a, "name");
    if (n != nullptr && n->is_string() && n->get_ref<const std::string&>() == key) return member(a, "value");
  }
  return nullptr;
}

}  // namespace

std::string parseEt(const json& et, const std::string& name, EtTrace& out) {
  out = EtTrace{};
  const std::string hint = "; is it a PyTorch Execution Trace (torch.profiler.ExecutionTraceObserver)?";
  if (!et.is_object()) return name + ": the document is not a JSON object" + hint;
  const json* schema = member(et, "schema");
  if (schema == nullptr || !schema->is_string()) return name + ": no \"schema\" string" + hint;
  out.schema = schema->get<std::string>();
  if (!out.schema.starts_with("1.0.") && !out.schema.starts_with("1.1.")) {
    return name + ": Execution Trace schema \"" + out.schema +
           "\" is not supported (this reader knows 1.0.x and 1.1.x); record with a PyTorch that writes one of those";
  }
  const json* nodes = member(et, "nodes");
  if (nodes == nullptr || !nodes->is_array()) return name + ": no \"nodes\" list" + hint;
  out.nodes.reserve(nodes->size());
  for (std::size_t i = 0; i < nodes->size(); ++i) {
    const json& n = (*nodes)[i];
    auto bad = [&](const std::string& what) {
      return name + ": node " + std::to_string(i) + ": " + what + hint;
    };
    if (!n.is_object()) return bad("not an object");
    EtNode node;
    const json* id = member(n, "id");
    if (id == nullptr || !asInt(*id, node.id)) return bad("no integer \"id\"");
    const json* nm = member(n, "name");
    if (nm == nullptr || !nm->is_string()) return bad("no \"name\" string");
    node.name = nm->get<std::string>();
    const json* parent = member(n, "ctrl_deps");
    if (parent == nullptr) parent = member(n, "parent");
    if (parent != nullptr && !asInt(*parent, node.parent)) return bad("\"ctrl_deps\"/\"parent\" is not an integer");
    if (const json* tid = attribute(n, "tid"); tid != nullptr && !asInt(*tid, node.tid)) node.tid = 0;
    if (const json* s = attribute(n, "op_schema"); s != nullptr && s->is_string()) node.schema = s->get<std::string>();
    if (std::string err = argumentsOf(n, "inputs", node.inputs); !err.empty()) return bad(err);
    if (std::string err = argumentsOf(n, "outputs", node.outputs); !err.empty()) return bad(err);
    out.nodes.push_back(std::move(node));
  }
  std::sort(out.nodes.begin(), out.nodes.end(), [](const EtNode& a, const EtNode& b) { return a.id < b.id; });
  std::unordered_map<std::int64_t, std::size_t> index;
  index.reserve(out.nodes.size());
  for (std::size_t i = 0; i < out.nodes.size(); ++i) {
    if (!index.emplace(out.nodes[i].id, i).second) {
      return name + ": two nodes have id " + std::to_string(out.nodes[i].id) + hint;
    }
  }
  for (std::size_t i = 0; i < out.nodes.size(); ++i) {
    const EtNode& n = out.nodes[i];
    auto p = index.find(n.parent);
    if (p == index.end() || p->second == i) {
      out.roots.push_back(i);
    } else {
      out.nodes[p->second].children.push_back(i);
    }
  }
  return {};
}

namespace {

bool nameHas(std::string_view name, std::initializer_list<std::string_view> parts) {
  for (std::string_view p : parts) {
    if (name.find(p) != std::string_view::npos) return true;
  }
  return false;
}

// Ops that change a storage's contents in place: aten's trailing underscore, or a mutable
// argument in the schema ("Tensor(a!) self"). detach_/set_/resize_ change metadata only.
bool writesInPlace(const EtNode& n) {
  if (n.schema.find("!)") != std::string::npos) return true;
  const std::size_t colon = n.name.rfind("::");
  const std::string_view base = std::string_view(n.name).substr(colon == std::string::npos ? 0 : colon + 2);
  if (base.size() < 2 || base.back() != '_') return false;
  return base != "detach_" && base != "set_" && base != "resize_" && base != "requires_grad_" &&
         base != "as_strided_" && !base.starts_with("_local_scalar");
}

// Not a pure function of its CUDA inputs: random numbers, collectives (other ranks' data),
// reads of host memory.
bool impure(const EtNode& n) {
  return nameHas(n.name, {"dropout", "rand", "bernoulli", "normal_", "uniform_", "multinomial", "nccl",
                          "c10d::", "record_param_comms", "exponential_", "geometric_", "cauchy_"});
}

enum class Role : std::uint8_t { kAlloc, kRead, kWrite };

struct Generation {
  std::uint64_t storage = 0;
  std::uint32_t seq = 0;     // 0 for the first buffer of this storage id
  std::uint64_t bytes = 0;
  std::uint64_t shape_numel = 0;
  std::vector<std::int64_t> shape;  // of its largest tensor
  bool created = false;     // an op returned it fresh (else it existed before the trace)
  std::size_t first_op = 0;
  std::size_t last_op = 0;
};

struct Op {
  std::size_t node = 0;                   // the outermost node
  std::vector<std::size_t> subtree;       // it and its descendants
  std::vector<std::pair<std::size_t, Role>> uses;  // generation, role
  bool pure = true;             // no random numbers, collectives or host data
  bool writes_existing = false;  // writes in place a storage made before it
  std::int64_t ns = 0;
};

class EtImporter {
 public:
  EtImporter(const EtTrace& trace, std::string name) : trace_(trace), name_(std::move(name)) {}

  std::string findOps();
  void trackStorages();
  std::string chooseIteration(EtImport& out);
  std::string timeOps(const json* kineto, const std::string& kineto_name, const GpuSpec& gpu, EtImport& out);
  std::string build(EtImport& out);

 private:
  std::vector<std::size_t> subtreeOf(std::size_t root) const;
  std::int64_t estimate(const Op& op, const GpuSpec& gpu) const;
  void inferBatch(Workload& w, const std::vector<std::size_t>& gen_of_buffer, EtImport& out) const;

  const EtTrace& trace_;
  std::string name_;
  std::vector<Op> ops_;
  std::vector<Generation> gens_;
  std::vector<int> iteration_of_op_;
  std::size_t first_ = 0, last_ = 0;  // the replayed ops, inclusive
};

std::vector<std::size_t> EtImporter::subtreeOf(std::size_t root) const {
  std::vector<std::size_t> out{root};
  for (std::size_t i = 0; i < out.size(); ++i) {
    const auto& c = trace_.nodes[out[i]].children;
    out.insert(out.end(), c.begin(), c.end());
  }
  return out;
}

bool touchesCuda(const EtNode& n) {
  for (const auto* list : {&n.inputs, &n.outputs}) {
    for (const EtTensorRef& t : *list) {
      if (t.cuda) return true;
    }
  }
  return false;
}

std::string EtImporter::findOps() {
  // Depth first from the roots; a node that touches CUDA storage is an op and ends the descent.
  std::vector<std::size_t> stack(trace_.roots.rbegin(), trace_.roots.rend());
  std::vector<bool> seen(trace_.nodes.size(), false);
  while (!stack.empty()) {
    const std::size_t i = stack.back();
    stack.pop_back();
    if (seen[i]) continue;
    seen[i] = true;
    if (touchesCuda(trace_.nodes[i])) {
      Op op;
      op.node = i;
      ops_.push_back(std::move(op));
      continue;
    }
    const auto& c = trace_.nodes[i].children;
    stack.insert(stack.end(), c.rbegin(), c.rend());
  }
  std::sort(ops_.begin(), ops_.end(), [](const Op& a, const Op& b) { return a.node < b.node; });
  if (ops_.empty()) return name_ + ": no op touches a CUDA tensor; was the trace recorded on a GPU?";
  for (Op& op : ops_) op.subtree = subtreeOf(op.node);
  return {};
}

void EtImporter::trackStorages() {
  std::unordered_map<std::uint64_t, std::size_t> current;  // storage id -> generation
  std::unordered_map<std::uint64_t, std::uint32_t> count;
  for (std::size_t k = 0; k < ops_.size(); ++k) {
    Op& op = ops_[k];
    const EtNode& outer = trace_.nodes[op.node];
    std::unordered_set<std::uint64_t> own_inputs;
    for (const EtTensorRef& t : outer.inputs) own_inputs.insert(t.storage);
    std::unordered_set<std::uint64_t> fresh, written;
    // Storages in first-touch order, with the largest extent and tensor seen.
    std::vector<std::uint64_t> order;
    std::unordered_map<std::uint64_t, std::pair<std::uint64_t, const EtTensorRef*>> touched;
    for (std::size_t x : op.subtree) {
      const EtNode& n = trace_.nodes[x];
      if (impure(n)) op.pure = false;
      std::unordered_set<std::uint64_t> inputs;
      for (const EtTensorRef& t : n.inputs) {
        inputs.insert(t.storage);
        if (!t.cuda && x == op.node) op.pure = false;  // host data
      }
      const bool in_place = writesInPlace(n);
      for (const EtTensorRef& t : n.outputs) {
        if (!t.cuda) continue;
        if (!inputs.contains(t.storage) && !own_inputs.contains(t.storage)) fresh.insert(t.storage);
        if (in_place && inputs.contains(t.storage)) written.insert(t.storage);
      }
      // In-place ops that return nothing (_foreach_add_) write their first argument.
      if (in_place && n.outputs.empty()) {
        for (const EtTensorRef& t : n.inputs) {
          if (t.cuda && t.arg == 0) written.insert(t.storage);
        }
      }
      for (const auto* list : {&n.inputs, &n.outputs}) {
        for (const EtTensorRef& t : *list) {
          if (!t.cuda) continue;
          const std::uint64_t extent = (t.offset + t.numel) * t.elem_bytes;
          auto [it, added] = touched.try_emplace(t.storage, extent, &t);
          if (added) order.push_back(t.storage);
          if (extent > it->second.first) it->second.first = extent;
          if (t.numel > it->second.second->numel) it->second.second = &t;
        }
      }
    }
    for (std::uint64_t s : order) {
      const auto& [extent, biggest] = touched[s];
      auto cur = current.find(s);
      Role role = Role::kRead;
      if (cur == current.end() || fresh.contains(s)) {
        Generation g;
        g.storage = s;
        g.seq = count[s]++;
        g.created = fresh.contains(s);
        g.first_op = k;
        current[s] = gens_.size();
        gens_.push_back(std::move(g));
        cur = current.find(s);
        if (fresh.contains(s)) role = Role::kAlloc;
      }
      if (role != Role::kAlloc && written.contains(s)) role = Role::kWrite;
      if (role == Role::kWrite) op.writes_existing = true;
      Generation& g = gens_[cur->second];
      g.last_op = k;
      g.bytes = std::max(g.bytes, extent);
      if (biggest->numel >= g.shape_numel && !biggest->shape.empty()) {
        g.shape = biggest->shape;
        g.shape_numel = biggest->numel;
      }
      op.uses.emplace_back(cur->second, role);
    }
  }
}

bool underNamed(const EtTrace& trace, std::size_t node, std::string_view prefix, std::size_t& which) {
  // Ancestors by parent id; nodes are sorted by id, so look parents up by binary search.
  std::size_t i = node;
  for (std::size_t hops = 0; hops < trace.nodes.size(); ++hops) {
    if (trace.nodes[i].name.starts_with(prefix)) {
      which = i;
      return true;
    }
    const std::int64_t p = trace.nodes[i].parent;
    auto it = std::lower_bound(trace.nodes.begin(), trace.nodes.end(), p,
                               [](const EtNode& n, std::int64_t id) { return n.id < id; });
    if (it == trace.nodes.end() || it->id != p) return false;
    const auto next = static_cast<std::size_t>(it - trace.nodes.begin());
    if (next == i) return false;
    i = next;
  }
  return false;
}

std::string EtImporter::chooseIteration(EtImport& out) {
  iteration_of_op_.assign(ops_.size(), -1);
  bool profiler_steps = false;
  std::vector<std::size_t> step_node(ops_.size(), 0);
  for (std::size_t k = 0; k < ops_.size(); ++k) {
    std::size_t which = 0;
    if (underNamed(trace_, ops_[k].node, "ProfilerStep#", which)) {
      profiler_steps = true;
      step_node[k] = which + 1;
    }
  }
  std::size_t complete = 0;
  if (profiler_steps) {
    // Each ProfilerStep# node is one iteration; ops outside them are left out.
    std::map<std::size_t, int> number;
    for (std::size_t k = 0; k < ops_.size(); ++k) {
      if (step_node[k] == 0) continue;
      auto [it, added] = number.try_emplace(step_node[k], static_cast<int>(number.size()));
      iteration_of_op_[k] = it->second;
    }
    complete = number.size();
  } else {
    // Without markers, an iteration ends with the ops of Optimizer.step: what follows the last
    // step is an incomplete one.
    int iteration = 0;
    bool previous_in_step = false;
    for (std::size_t k = 0; k < ops_.size(); ++k) {
      std::size_t which = 0;
      const bool in_step = underNamed(trace_, ops_[k].node, "Optimizer.step", which);
      if (previous_in_step && !in_step) ++iteration;
      previous_in_step = in_step;
      iteration_of_op_[k] = iteration;
    }
    complete = static_cast<std::size_t>(iteration) + (previous_in_step ? 1 : 0);
    if (complete == 0) complete = 1;  // no optimizer step: the whole trace is the iteration
  }
  out.iterations = complete;
  const int chosen = static_cast<int>(complete) - 1;
  bool found = false;
  for (std::size_t k = 0; k < ops_.size(); ++k) {
    if (iteration_of_op_[k] != chosen) continue;
    if (!found) first_ = k;
    last_ = k;
    found = true;
  }
  if (!found) return name_ + ": no op in the trace's iterations";
  out.notes.push_back(fmt::format("{} iteration{} found ({}); replaying the last, {} ops", complete,
                                  complete == 1 ? "" : "s",
                                  profiler_steps ? "ProfilerStep# nodes" : "ends of Optimizer.step",
                                  last_ - first_ + 1));
  return {};
}

std::int64_t EtImporter::estimate(const Op& op, const GpuSpec& gpu) const {
  // Post-order over the subtree: a node costs its own estimate or its children's sum, whichever
  // is larger (parents repeat their children's arguments); a FLOPs op is not descended into.
  std::unordered_map<std::size_t, std::int64_t> cost;
  std::vector<std::pair<std::size_t, bool>> stack{{op.node, false}};
  std::vector<OpTensor> ins, outs;
  auto convert = [](const std::vector<EtTensorRef>& from, std::vector<OpTensor>& to) {
    to.clear();
    for (const EtTensorRef& t : from) to.push_back({t.shape, t.numel, t.elem_bytes, t.cuda});
  };
  while (!stack.empty()) {
    auto [i, expanded] = stack.back();
    stack.pop_back();
    const EtNode& n = trace_.nodes[i];
    const bool flops = isFlopsOp(n.name);
    if (!expanded && !flops && !n.children.empty()) {
      stack.emplace_back(i, true);
      for (std::size_t c : n.children) stack.emplace_back(c, false);
      continue;
    }
    convert(n.inputs, ins);
    convert(n.outputs, outs);
    std::int64_t own = estimateOp({n.name, &ins, &outs}, gpu).ns;
    if (!flops) {
      std::int64_t children = 0;
      for (std::size_t c : n.children) children += cost[c];
      own = std::max(own, children);
    }
    cost[i] = own;
  }
  return cost[op.node];
}

std::string EtImporter::timeOps(const json* kineto, const std::string& kineto_name, const GpuSpec& gpu,
                                EtImport& out) {
  for (std::size_t k = first_; k <= last_; ++k) ops_[k].ns = estimate(ops_[k], gpu);
  if (kineto == nullptr) {
    out.notes.push_back(fmt::format("durations from the cost model for {} ({})", gpu.name, gpu.label));
    return {};
  }
  std::vector<std::int64_t> op_of_node(trace_.nodes.size(), -1);
  for (std::size_t k = first_; k <= last_; ++k) {
    for (std::size_t x : ops_[k].subtree) op_of_node[x] = static_cast<std::int64_t>(k - first_);
  }
  KinetoJoin join;
  if (std::string err = joinKineto(trace_, op_of_node, last_ - first_ + 1, *kineto, kineto_name, join); !err.empty()) {
    return err;
  }
  std::size_t estimated = 0, no_kernel = 0;
  for (std::size_t k = first_; k <= last_; ++k) {
    const std::size_t j = k - first_;
    if (!join.op_matched[j]) {
      ++estimated;  // not in the profile: keep the cost model's figure
      continue;
    }
    ops_[k].ns = join.op_gpu_ns[j];
    if (join.op_kernels[j] == 0) ++no_kernel;
  }
  out.kineto_coverage = join.coverage();
  out.profiled_gpu_ns = join.window_gpu_ns;
  out.notes.push_back(fmt::format(
      "durations from Kineto {}: {} of {} ET nodes joined; {:.1f} % of the iteration's GPU time "
      "({:.2f} ms over {} kernels) joined to ops; {} kernels ({:.2f} ms) with no op; {} ops with no "
      "kernel; {} ops not in the profile (cost model for {})",
      kineto_name, join.matched_nodes, join.et_nodes, 100.0 * out.kineto_coverage,
      static_cast<double>(join.window_gpu_ns) / 1e6, join.window_kernels, join.unjoined_kernels,
      static_cast<double>(join.window_gpu_ns - join.joined_gpu_ns) / 1e6, no_kernel, estimated, gpu.name));
  return {};
}

void EtImporter::inferBatch(Workload& w, const std::vector<std::size_t>& gen_of_buffer, EtImport& out) const {
  // Parameter shapes: a gradient or optimizer state shaped like a parameter is not batch-sized
  // even when its leading dimension equals the batch.
  std::set<std::vector<std::int64_t>> parameter_shapes;
  for (std::size_t b = 0; b < w.buffers.size(); ++b) {
    if (w.buffers[b].persistent) parameter_shapes.insert(gens_[gen_of_buffer[b]].shape);
  }
  std::map<std::int64_t, std::uint64_t> bytes_by_leading;
  for (std::size_t b = 0; b < w.buffers.size(); ++b) {
    const Generation& g = gens_[gen_of_buffer[b]];
    if (w.buffers[b].persistent || g.shape.size() < 2 || parameter_shapes.contains(g.shape)) continue;
    bytes_by_leading[g.shape[0]] += w.buffers[b].bytes;
  }
  std::int64_t batch = 0;
  std::uint64_t best = 0;
  for (const auto& [leading, bytes] : bytes_by_leading) {
    if (bytes > best) {
      best = bytes;
      batch = leading;
    }
  }
  out.batch = batch;
  std::size_t scaled = 0;
  for (std::size_t b = 0; b < w.buffers.size(); ++b) {
    const Generation& g = gens_[gen_of_buffer[b]];
    const bool batch_sized = !w.buffers[b].persistent && batch > 0 && !g.shape.empty() &&
                             g.shape[0] == batch && !parameter_shapes.contains(g.shape);
    w.buffers[b].scales_with_batch = batch_sized;
    scaled += batch_sized ? 1 : 0;
  }
  for (WorkloadOp& op : w.ops) {
    bool touches = false;
    for (const auto* list : {&op.allocs, &op.reads, &op.writes}) {
      for (BufferId id : *list) touches = touches || w.buffers[id].scales_with_batch;
    }
    op.scales_with_batch = touches;
  }
  out.notes.push_back(batch > 0 ? fmt::format("batch {} (the leading dimension of most activation bytes): "
                                              "{} of {} buffers scale with it",
                                              batch, scaled, w.buffers.size())
                                : std::string("no batch dimension found: nothing scales with --batch"));
}

std::string EtImporter::build(EtImport& out) {
  Workload& w = out.workload;
  w.name = name_;
  std::vector<std::int64_t> buffer_of_gen(gens_.size(), -1);
  std::vector<std::size_t> gen_of_buffer;
  std::uint64_t persistent_bytes = 0;
  for (std::size_t k = first_; k <= last_; ++k) {
    for (const auto& [g, role] : ops_[k].uses) {
      if (buffer_of_gen[g] >= 0) continue;
      const Generation& gen = gens_[g];
      WorkloadBuffer b;
      b.name = gen.seq == 0 ? fmt::format("storage {}", gen.storage)
                            : fmt::format("storage {}#{}", gen.storage, gen.seq);
      b.bytes = gen.bytes;
      b.persistent = !gen.created || gen.first_op < first_ || gen.last_op > last_;
      if (b.persistent) persistent_bytes += b.bytes;
      buffer_of_gen[g] = static_cast<std::int64_t>(w.buffers.size());
      gen_of_buffer.push_back(g);
      w.buffers.push_back(std::move(b));
    }
  }
  // Whether a buffer has been used since the op that made it.
  std::vector<bool> used_since_made(w.buffers.size(), false);
  std::size_t folded = 0;
  for (std::size_t k = first_; k <= last_; ++k) {
    const Op& op = ops_[k];
    WorkloadOp wop;
    wop.name = trace_.nodes[op.node].name;
    wop.compute_ns = op.ns;
    const auto index = static_cast<std::int32_t>(w.ops.size());
    for (const auto& [g, role] : op.uses) {
      const auto id = static_cast<BufferId>(buffer_of_gen[g]);
      WorkloadBuffer& b = w.buffers[id];
      if (role == Role::kAlloc && !b.persistent) {
        wop.allocs.push_back(id);
        b.producer = index;
        b.recompute_ns = op.pure && !op.writes_existing ? op.ns : kUnknownNs;
      } else if (role == Role::kRead) {
        wop.reads.push_back(id);
      } else if (role == Role::kWrite && op.pure && op.uses.size() == 1 && b.recompute_ns != kUnknownNs &&
                 !used_since_made[id]) {
        // An in-place op on a result nothing has read yet, with no other input (conv, batch
        // norm, then relu_): the value it leaves is still a pure function of the producer's
        // inputs, recomputed by running both. A write would end recomputability for good.
        wop.reads.push_back(id);
        b.recompute_ns += op.ns;
        ++folded;
      } else {
        wop.writes.push_back(id);  // in place, or a persistent buffer (re)made by this op
      }
      if (role != Role::kAlloc) used_since_made[id] = true;
      if (!b.persistent && gens_[g].last_op == k) wop.frees.push_back(id);
    }
    w.ops.push_back(std::move(wop));
  }
  inferBatch(w, gen_of_buffer, out);
  std::size_t recomputable = 0;
  for (const WorkloadBuffer& b : w.buffers) recomputable += b.recompute_ns != kUnknownNs ? 1 : 0;
  out.notes.push_back(fmt::format("{} buffers recomputable by re-running their op ({} with the in-place op "
                                  "that followed it)",
                                  recomputable, folded));
  out.notes.push_back(fmt::format("{} buffers, {:.1f} MiB persistent (parameters, inputs, optimizer state), "
                                  "peak {:.1f} MiB",
                                  w.buffers.size(), static_cast<double>(persistent_bytes) / (1 << 20),
                                  static_cast<double>(w.peakBytes()) / (1 << 20)));
  if (std::string err = w.validate(); !err.empty()) return name_ + ": inconsistent trace: " + err;
  return {};
}

EtImport importParsed(const json& et, const json* kineto, const EtImportOptions& options, const std::string& name,
                      const std::string& kineto_name) {
  EtImport out;
  const std::string gpu_name = options.gpu.empty() ? std::string(kDefaultGpu) : options.gpu;
  const std::optional<GpuSpec> gpu = findGpu(gpu_name);
  if (!gpu) {
    out.error = "unknown GPU '" + gpu_name + "' (known: " + gpuNames() + ")";
    return out;
  }
  EtTrace trace;
  if (std::string err = parseEt(et, name, trace); !err.empty()) {
    out.error = err;
    return out;
  }
  EtImporter imp(trace, name);
  std::string err = imp.findOps();
  if (err.empty()) {
    imp.trackStorages();
    err = imp.chooseIteration(out);
  }
  if (err.empty()) err = imp.timeOps(kineto, kineto_name, *gpu, out);
  if (err.empty()) err = imp.build(out);
  if (!err.empty()) {
    out.error = err;
    out.workload = {};
  }
  return out;
}

}  // namespace

EtImport importPyTorchEtText(const std::string& et_text, const std::string& kineto_text,
                             const EtImportOptions& options, const std::string& name) {
  EtImport out;
  json et, kineto;
  if (std::string err = parseJson(name, et_text, et); !err.empty()) {
    out.error = err;
    return out;
  }
  const std::string kineto_name = options.kineto_path.empty() ? name + " (kineto)" : options.kineto_path;
  if (!kineto_text.empty()) {
    if (std::string err = parseJson(kineto_name, kineto_text, kineto); !err.empty()) {
      out.error = err;
      return out;
    }
  }
  return importParsed(et, kineto_text.empty() ? nullptr : &kineto, options, name, kineto_name);
}

EtImport importPyTorchEt(const std::string& path, const EtImportOptions& options) {
  EtImport out;
  std::string et_text, kineto_text;
  if (std::string err = readTextFile(path, kMaxTextBytes, et_text); !err.empty()) {
    out.error = err;
    return out;
  }
  if (!options.kineto_path.empty()) {
    if (std::string err = readTextFile(options.kineto_path, kMaxTextBytes, kineto_text); !err.empty()) {
      out.error = err;
      return out;
    }
    if (kineto_text.empty()) {
      out.error = options.kineto_path + ": empty file; pass the Kineto trace recorded with the ET";
      return out;
    }
  }
  return importPyTorchEtText(et_text, kineto_text, options, path);
}

}  // namespace delta::tools
