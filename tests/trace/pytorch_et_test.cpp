// The PyTorch Execution Trace importer and its Kineto join (tools/pytorch_et.h,
// tools/kineto_join.h) on small hand-made traces: both schemas, views, in-place ops, nested
// ops, several iterations, missing durations, batch scaling, and bad input.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "tools/gpu_cost_model.h"
#include "tools/pytorch_et.h"

namespace delta::tools {
namespace {

using nlohmann::json;
using policy::BufferId;
using policy::kUnknownNs;
using policy::Workload;

struct Tensor {
  std::int64_t id;
  std::int64_t storage;
  std::vector<std::int64_t> shape;
  std::string device = "cuda:0";
  std::int64_t elem_bytes = 4;
  std::int64_t offset = 0;

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
  }
  json value() const { return json::array({id, storage, offset, numel(), elem_bytes, device}); }
};

// Writes ETs the way PyTorch does: 1.0.x with flat fields, 1.1.x with values/shapes and attrs.
class EtBuilder {
 public:
  explicit EtBuilder(std::string schema = "1.1.0-chakra.0.0.4") : schema_(std::move(schema)) {
    add(1, 1, "[pytorch|profiler|execution_trace|process]", {}, {}, 0);
    add(2, 1, "[pytorch|profiler|execution_trace|thread]", {}, {}, 1);
  }
  // A node; returns its id. Ids grow in call order: call parents before their children.
  std::int64_t node(const std::string& name, std::int64_t parent, const std::vector<Tensor>& in,
                    const std::vector<Tensor>& out, std::int64_t tid = 1, const std::string& op_schema = "") {
    const std::int64_t id = next_++;
    add(id, parent, name, in, out, tid, op_schema);
    return id;
  }
  std::string text() const { return json{{"schema", schema_}, {"pid", 7}, {"nodes", nodes_}}.dump(); }

 private:
  void add(std::int64_t id, std::int64_t parent, const std::string& name, const std::vector<Tensor>& in,
           const std::vector<Tensor>& out, std::int64_t tid, const std::string& op_schema = "") {
    json values_in = json::array(), shapes_in = json::array(), values_out = json::array(), shapes_out = json::array();
    for (const Tensor& t : in) {
      values_in.push_back(t.value());
      shapes_in.push_back(t.shape);
    }
    for (const Tensor& t : out) {
      values_out.push_back(t.value());
      shapes_out.push_back(t.shape);
    }
    json n;
    n["id"] = id;
    n["name"] = name;
    if (schema_.starts_with("1.0.")) {
      n["parent"] = parent;
      n["tid"] = tid;
      n["op_schema"] = op_schema;
      n["inputs"] = values_in;
      n["input_shapes"] = shapes_in;
      n["outputs"] = values_out;
      n["output_shapes"] = shapes_out;
    } else {
      n["ctrl_deps"] = parent;
      n["inputs"] = {{"values", values_in}, {"shapes", shapes_in}, {"types", json::array()}};
      n["outputs"] = {{"values", values_out}, {"shapes", shapes_out}, {"types", json::array()}};
      n["attrs"] = json::array({json{{"name", "tid"}, {"type", "uint64"}, {"value", tid}},
                                json{{"name", "op_schema"}, {"type", "string"}, {"value", op_schema}}});
    }
    nodes_.push_back(n);
  }

  std::string schema_;
  json nodes_ = json::array();
  std::int64_t next_ = 3;
};

EtImport import(const std::string& et, const std::string& kineto = "", const std::string& gpu = "") {
  EtImportOptions options;
  options.gpu = gpu;
  return importPyTorchEtText(et, kineto, options, "test.et.json");
}

BufferId bufferNamed(const Workload& w, const std::string& name) {
  for (BufferId i = 0; i < w.buffers.size(); ++i) {
    if (w.buffers[i].name == name) return i;
  }
  ADD_FAILURE() << "no buffer " << name;
  return 0;
}

bool contains(const std::vector<BufferId>& v, BufferId id) {
  for (BufferId x : v) {
    if (x == id) return true;
  }
  return false;
}

// x = host batch copied in; y = x @ w; z = relu(y); loss = sum(z).
std::string forwardEt(const std::string& schema, std::int64_t batch = 8) {
  EtBuilder b(schema);
  const Tensor host{1, 1, {batch, 16}, "cpu"};
  const Tensor x{2, 10, {batch, 16}};
  const Tensor w{3, 100, {16, 16}};
  const Tensor y{4, 11, {batch, 16}};
  const Tensor z{5, 12, {batch, 16}};
  const Tensor loss{6, 13, {}};
  b.node("aten::to", 2, {host}, {x});
  b.node("aten::mm", 2, {x, w}, {y});
  b.node("aten::relu", 2, {y}, {z});
  b.node("aten::sum", 2, {z}, {loss});
  return b.text();
}

class BothSchemas : public ::testing::TestWithParam<std::string> {};

TEST_P(BothSchemas, StoragesBecomeBuffersWithLifetimesFromFirstToLastUse) {
  const EtImport r = import(forwardEt(GetParam()));
  ASSERT_EQ(r.error, "");
  const Workload& w = r.workload;
  ASSERT_EQ(w.ops.size(), 4u);
  EXPECT_EQ(w.ops[1].name, "aten::mm");
  EXPECT_EQ(w.buffers.size(), 5u);  // the host tensor is not a GPU buffer
  const BufferId x = bufferNamed(w, "storage 10"), weight = bufferNamed(w, "storage 100");
  const BufferId y = bufferNamed(w, "storage 11");
  EXPECT_TRUE(w.buffers[weight].persistent) << "read before anything made it: a parameter";
  EXPECT_FALSE(w.buffers[x].persistent);
  EXPECT_EQ(w.buffers[x].bytes, 8u * 16 * 4);
  EXPECT_TRUE(contains(w.ops[0].allocs, x));
  EXPECT_TRUE(contains(w.ops[1].frees, x)) << "freed after its last use";
  EXPECT_TRUE(contains(w.ops[1].reads, weight));
  EXPECT_TRUE(contains(w.ops[1].allocs, y));
  EXPECT_EQ(w.buffers[y].producer, 1);
  EXPECT_EQ(w.buffers[y].recompute_ns, w.ops[1].compute_ns) << "mm is a pure function of its inputs";
  EXPECT_EQ(w.buffers[x].recompute_ns, kUnknownNs) << "a copy from the host cannot be recomputed on the GPU";
  // aten::to without children copies nothing on the GPU (when it copies, its copy_ child does).
  EXPECT_EQ(w.ops[0].compute_ns, 0);
  for (std::size_t i = 1; i < w.ops.size(); ++i) EXPECT_GT(w.ops[i].compute_ns, 0) << w.ops[i].name;
  EXPECT_EQ(w.validate(), "");
  EXPECT_EQ(r.iterations, 1u);
  EXPECT_EQ(r.batch, 8);
}

INSTANTIATE_TEST_SUITE_P(PyTorchEt, BothSchemas, ::testing::Values("1.0.1", "1.1.0-chakra.0.0.4", "1.1.1"));

TEST(PyTorchEt, ViewsShareTheirStorage) {
  EtBuilder b;
  const Tensor x{2, 10, {8, 16}};
  const Tensor x_view{3, 10, {128}};
  const Tensor x_half{4, 10, {4, 16}, "cuda:0", 4, 64};  // a slice: offset 64 elements
  const Tensor y{5, 11, {128}};
  b.node("aten::ones", 2, {}, {x});
  b.node("aten::view", 2, {x}, {x_view});
  b.node("aten::slice", 2, {x}, {x_half});
  b.node("aten::neg", 2, {x_view}, {y});
  const EtImport r = import(b.text());
  ASSERT_EQ(r.error, "");
  const Workload& w = r.workload;
  EXPECT_EQ(w.buffers.size(), 2u) << "the view and the slice are the same storage";
  const BufferId x_buf = bufferNamed(w, "storage 10");
  EXPECT_EQ(w.buffers[x_buf].bytes, 8u * 16 * 4);
  EXPECT_TRUE(contains(w.ops[1].reads, x_buf));
  EXPECT_TRUE(w.ops[1].allocs.empty()) << "a view allocates nothing";
  EXPECT_EQ(w.ops[1].compute_ns, 0) << "a view launches no kernel";
  EXPECT_TRUE(contains(w.ops[3].frees, x_buf)) << "alive while its view is used";
  EXPECT_EQ(w.peakBytes(), 2u * 8 * 16 * 4);
}

TEST(PyTorchEt, InPlaceOpsWriteAndEndRecomputability) {
  EtBuilder b;
  const Tensor x{2, 10, {8, 16}};
  const Tensor y{3, 11, {8, 16}};
  const Tensor out{4, 12, {8, 16}};
  b.node("aten::ones", 2, {}, {x});
  b.node("aten::exp", 2, {x}, {y});
  b.node("aten::relu_", 2, {y}, {y}, 1, "aten::relu_(Tensor(a!) self) -> Tensor(a!)");
  b.node("aten::add_", 2, {y, x}, {y});
  b.node("aten::neg", 2, {y}, {out});
  const EtImport r = import(b.text());
  ASSERT_EQ(r.error, "");
  const Workload& w = r.workload;
  const BufferId y_buf = bufferNamed(w, "storage 11");
  EXPECT_EQ(w.buffers.size(), 3u) << "in place: no new buffer";
  EXPECT_TRUE(w.ops[2].allocs.empty());
  // relu_ right after exp, on nothing else: exp then relu_ recompute what it leaves.
  EXPECT_TRUE(contains(w.ops[2].reads, y_buf));
  EXPECT_TRUE(w.ops[2].writes.empty());
  EXPECT_EQ(w.buffers[y_buf].recompute_ns, w.ops[1].compute_ns + w.ops[2].compute_ns);
  // add_ also reads x: a write, which ends recomputability when replayed.
  EXPECT_TRUE(contains(w.ops[3].writes, y_buf));
  EXPECT_TRUE(contains(w.ops[3].reads, bufferNamed(w, "storage 10")));
  EXPECT_EQ(w.buffers[y_buf].producer, 1) << "still made by exp; the simulator drops recompute after a write";
  EXPECT_EQ(w.validate(), "");
}

TEST(PyTorchEt, NestedOpsCountOnceAsTheOutermost) {
  EtBuilder b;
  const Tensor x{2, 10, {1024, 512}};
  const Tensor weight{3, 100, {2048, 512}};
  const Tensor weight_t{4, 100, {512, 2048}};
  const Tensor bias{5, 101, {2048}};
  const Tensor y{6, 11, {1024, 2048}};
  const Tensor scratch{7, 50, {1024, 2048}};
  b.node("aten::ones", 2, {}, {x});
  const std::int64_t linear = b.node("aten::linear", 2, {x, weight, bias}, {y});
  b.node("aten::t", linear, {weight}, {weight_t});
  const std::int64_t addmm = b.node("aten::addmm", linear, {bias, x, weight_t}, {y});
  b.node("aten::empty", addmm, {}, {scratch});  // a temporary inside the op
  b.node("aten::sum", 2, {y}, {Tensor{8, 12, {}}});
  const EtImport r = import(b.text(), "", "v100-16gb");
  ASSERT_EQ(r.error, "");
  const Workload& w = r.workload;
  ASSERT_EQ(w.ops.size(), 3u) << "linear's children are part of it";
  EXPECT_EQ(w.ops[1].name, "aten::linear");
  const BufferId tmp = bufferNamed(w, "storage 50");
  EXPECT_TRUE(contains(w.ops[1].allocs, tmp));
  EXPECT_TRUE(contains(w.ops[1].frees, tmp)) << "a temporary lives within its op";
  // The FLOPs of one linear layer, not those of addmm again.
  const std::vector<OpTensor> in = {{{1024, 512}, 1024 * 512, 4, true}, {{2048, 512}, 2048 * 512, 4, true},
                                    {{2048}, 2048, 4, true}};
  const std::vector<OpTensor> out = {{{1024, 2048}, 1024 * 2048, 4, true}};
  const OpCost linear_cost = estimateOp({"aten::linear", &in, &out}, *findGpu("v100-16gb"));
  EXPECT_EQ(linear_cost.flops, 2.0 * 1024 * 512 * 2048);
  EXPECT_GT(linear_cost.ns, 100000) << "FLOP-bound, well above the launch floor";
  EXPECT_EQ(w.ops[1].compute_ns, linear_cost.ns) << "not the children's time on top";
}

// Two iterations of forward, backward and SGD with momentum; ids come back with addresses.
std::string trainingEt(std::int64_t batch, int iterations) {
  EtBuilder b;
  const Tensor weight{1, 100, {8, 16}};  // leading dimension 8: the batch of the small trace
  std::int64_t id = 1000;
  for (int it = 0; it < iterations; ++it) {
    const Tensor host{id++, 1, {batch, 16}, "cpu"};
    const Tensor x{id++, 10, {batch, 2, 8}};  // not shaped like the weight, even at batch 8
    const Tensor y{id++, 11, {batch, 8}};
    const Tensor dy{id++, 12, {batch, 8}};
    const Tensor grad{id++, 13, {8, 16}};
    const Tensor momentum{500, 14, {8, 16}};
    b.node("aten::to", 2, {host}, {x});
    b.node("aten::mm", 2, {x, Tensor{id++, 100, {16, 8}}}, {y});
    b.node("aten::ones_like", 2, {y}, {dy});
    const std::int64_t backward = b.node("MmBackward0", 2, {dy}, {}, 2);
    b.node("aten::mm", backward, {dy, x}, {grad}, 2);
    const std::int64_t step = b.node("Optimizer.step#SGD.step", 2, {}, {});
    if (it == 0) b.node("aten::clone", step, {grad}, {momentum});
    else b.node("aten::add_", step, {momentum, grad}, {momentum});
    b.node("aten::add_", step, {weight, momentum}, {weight});
  }
  return b.text();
}

TEST(PyTorchEt, SeveralIterationsReplayTheLastWithStateAcrossThemPersistent) {
  const EtImport r = import(trainingEt(32, 2));
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.iterations, 2u);
  const Workload& w = r.workload;
  ASSERT_EQ(w.ops.size(), 6u) << "one iteration";
  EXPECT_EQ(w.ops[0].name, "aten::to");
  EXPECT_TRUE(w.buffers[bufferNamed(w, "storage 100")].persistent);
  EXPECT_TRUE(w.buffers[bufferNamed(w, "storage 14")].persistent) << "momentum: made in the first iteration";
  const BufferId x = bufferNamed(w, "storage 10#1");  // the second buffer with that storage id
  EXPECT_FALSE(w.buffers[x].persistent);
  EXPECT_FALSE(w.buffers[bufferNamed(w, "storage 13#1")].persistent) << "gradients are made afresh";
  EXPECT_EQ(w.validate(), "");
}

TEST(PyTorchEt, BatchScalingPredictsTheTraceRecordedAtTwiceTheBatch) {
  for (std::int64_t batch : {8, 24}) {
    SCOPED_TRACE(batch);
    const EtImport small = import(trainingEt(batch, 2));
    const EtImport large = import(trainingEt(2 * batch, 2));
    ASSERT_EQ(small.error, "");
    ASSERT_EQ(large.error, "");
    EXPECT_EQ(small.batch, batch);
    EXPECT_EQ(large.batch, 2 * batch);
    const Workload& w = small.workload;
    EXPECT_FALSE(w.buffers[bufferNamed(w, "storage 13#1")].scales_with_batch)
        << "a gradient shaped like its parameter does not grow with the batch, even at batch 8";
    EXPECT_TRUE(w.buffers[bufferNamed(w, "storage 11#1")].scales_with_batch);
    EXPECT_EQ(w.scaled(2.0).peakBytes(), large.workload.peakBytes());
    EXPECT_FALSE(w.ops.back().scales_with_batch) << "the optimizer touches parameters only";
    EXPECT_EQ(w.scaled(2.0).ops.back().compute_ns, w.ops.back().compute_ns);
  }
}

// A Kineto trace: CPU ops (name, start µs, duration µs, tid), each with kernels launched from it
// (runtime call at start+1 µs, kernel duration µs). Correlations are numbered here.
struct KOp {
  std::string name;
  double ts, dur;
  std::int64_t tid;
  std::vector<double> kernels;
};

std::string kinetoText(const std::vector<KOp>& ops, const std::vector<double>& stray_kernels_at = {}) {
  json events = json::array();
  std::int64_t corr = 1;
  for (const KOp& op : ops) {
    events.push_back({{"ph", "X"}, {"cat", "cpu_op"}, {"name", op.name}, {"pid", 9}, {"tid", op.tid},
                      {"ts", op.ts}, {"dur", op.dur}, {"args", {{"External id", corr}}}});
    double at = op.ts + 1;
    for (double k : op.kernels) {
      events.push_back({{"ph", "X"}, {"cat", "cuda_runtime"}, {"name", "cudaLaunchKernel"}, {"pid", 9},
                        {"tid", op.tid}, {"ts", at}, {"dur", 0.5}, {"args", {{"correlation", corr}}}});
      events.push_back({{"ph", "X"}, {"cat", "kernel"}, {"name", "k"}, {"pid", 0}, {"tid", 7}, {"ts", at + 10},
                        {"dur", k}, {"args", {{"correlation", corr}, {"External id", corr}}}});
      ++corr;
      at += 0.1;
    }
  }
  for (double at : stray_kernels_at) {  // launched outside every op (another thread)
    events.push_back({{"ph", "X"}, {"cat", "cuda_runtime"}, {"name", "cudaMemsetAsync"}, {"pid", 9},
                      {"tid", 99}, {"ts", at}, {"dur", 0.5}, {"args", {{"correlation", corr}}}});
    events.push_back({{"ph", "X"}, {"cat", "gpu_memset"}, {"name", "Memset"}, {"pid", 0}, {"tid", 7},
                      {"ts", at + 5}, {"dur", 4.0}, {"args", {{"correlation", corr}}}});
    ++corr;
  }
  return json{{"schemaVersion", 1}, {"traceEvents", events}}.dump();
}

TEST(KinetoJoin, KernelsTimeTheirOpsAndMissingOpsFallBackToTheCostModel) {
  // forwardEt's ops: to, mm, relu, sum. The profile has an earlier iteration's ops first
  // (aten::empty noise), then the ET's; relu is missing from it.
  const std::vector<KOp> kineto = {
      {"aten::empty", 0, 5, 1, {}},
      {"aten::to", 100, 50, 1, {20}},
      {"aten::mm", 200, 50, 1, {30, 12}},
      {"aten::sum", 400, 30, 1, {7}},
  };
  EtImportOptions options;
  const EtImport r = importPyTorchEtText(forwardEt("1.0.1"), kinetoText(kineto, {300}), options, "k.et");
  ASSERT_EQ(r.error, "");
  const Workload& w = r.workload;
  EXPECT_EQ(w.ops[0].compute_ns, 20000);
  EXPECT_EQ(w.ops[1].compute_ns, 42000) << "both of mm's kernels";
  EXPECT_EQ(w.ops[3].compute_ns, 7000);
  const EtImport model = import(forwardEt("1.0.1"));
  EXPECT_EQ(w.ops[2].compute_ns, model.workload.ops[2].compute_ns) << "relu was not profiled: estimated";
  EXPECT_EQ(r.profiled_gpu_ns, 73000);  // the stray memset at 300 µs is inside the iteration
  EXPECT_NEAR(r.kineto_coverage, 69.0 / 73.0, 1e-9);
  bool reported = false;
  for (const std::string& n : r.notes) reported = reported || n.find("1 kernels (0.00 ms) with no op") != std::string::npos;
  EXPECT_TRUE(reported) << "the unjoined kernel is reported";
}

TEST(KinetoJoin, TheRightIterationOfAProfileIsFoundOnEachThread) {
  // Forward on thread 1, backward on thread 2 (Kineto tids 500 and 600); the profile holds two
  // iterations, and the first differs (a warm-up op). The ET is one iteration.
  EtBuilder b("1.0.1");
  const Tensor x{2, 10, {4, 4}}, y{3, 11, {4, 4}}, g{4, 12, {4, 4}};
  b.node("aten::ones", 2, {}, {x});
  b.node("aten::exp", 2, {x}, {y});
  const std::int64_t back = b.node("ExpBackward0", 2, {y}, {}, 2);
  b.node("aten::mul", back, {y, x}, {g}, 2);
  std::vector<KOp> k;
  for (int it = 0; it < 2; ++it) {
    const double t0 = 1000.0 * it;
    k.push_back({"aten::ones", t0, 10, 500, {1}});
    if (it == 0) k.push_back({"aten::warmup", t0 + 20, 10, 500, {100}});
    k.push_back({"aten::exp", t0 + 40, 10, 500, {2.0 + it}});
    k.push_back({"ExpBackward0", t0 + 60, 30, 600, {}});
    k.push_back({"aten::mul", t0 + 61, 10, 600, {5.0 + it}});
  }
  EtImportOptions options;
  const EtImport r = importPyTorchEtText(b.text(), kinetoText(k), options, "two.et");
  ASSERT_EQ(r.error, "");
  // The first full match wins: iteration 0, its warm-up kernel counted but not joined.
  EXPECT_EQ(r.workload.ops[1].compute_ns, 2000);
  EXPECT_EQ(r.workload.ops[2].compute_ns, 5000) << "the backward thread, same iteration";
  EXPECT_EQ(r.profiled_gpu_ns, 108000);
}

struct BadCase {
  std::string name;
  std::string et;
  std::string kineto;
  std::string expected;  // part of the message
};

TEST(PyTorchEtBadInput, OneClearLineNamingTheFile) {
  const std::string good = forwardEt("1.1.0");
  const std::string truncated = good.substr(0, good.size() / 2);
  json wrong_schema = json::parse(good);
  wrong_schema["schema"] = "2.0.0";
  json huge = json::parse(good);
  huge["nodes"][2]["inputs"]["values"][0] = json::array({1, 1, 0, 1ull << 62, 4, "cuda:0"});
  json negative = json::parse(good);
  negative["nodes"][3]["outputs"]["values"][0] = json::array({1, -5, 0, 4, 4, "cuda:0"});
  json huge_id = json::parse(good);
  huge_id["nodes"][3]["id"] = 1e300;
  json dup = json::parse(good);
  dup["nodes"][4]["id"] = dup["nodes"][3]["id"];
  json no_nodes = json::parse(good);
  no_nodes.erase("nodes");
  json deep = json::parse(good);
  json nest = json::array({1});
  for (int i = 0; i < 50; ++i) nest = json::array({nest});
  deep["nodes"][3]["inputs"]["values"].push_back(nest);
  json cpu_only = json::parse(forwardEt("1.1.0"));
  for (json& n : cpu_only["nodes"]) {
    for (const char* side : {"inputs", "outputs"}) {
      for (json& v : n[side]["values"]) v[5] = "cpu";
    }
  }
  const std::vector<BadCase> cases = {
      {"empty", "", "", "not valid JSON"},
      {"truncated", truncated, "", "truncated"},
      {"wrong schema", wrong_schema.dump(), "", "schema \"2.0.0\" is not supported"},
      {"huge numel", huge.dump(), "", "absurd size"},
      {"negative storage", negative.dump(), "", "not a non-negative integer"},
      {"huge id", huge_id.dump(), "", "no integer \"id\""},
      {"duplicate id", dup.dump(), "", "two nodes have id"},
      {"no nodes", no_nodes.dump(), "", "no \"nodes\" list"},
      {"nested too deep", deep.dump(), "", "nested deeper"},
      {"no GPU op", cpu_only.dump(), "", "no op touches a CUDA tensor"},
      {"an array", "[1,2,3]", "", "not a JSON object"},
      {"kineto truncated", good, "{\"traceEvents\": [", "truncated"},
      {"kineto without events", good, "{\"x\": 1}", "no \"traceEvents\""},
      {"kineto of another run", good, kinetoText({{"aten::other", 0, 5, 1, {3}}}), "does not match"},
      {"kineto huge ts", good, "{\"traceEvents\":[{\"ph\":\"X\",\"cat\":\"kernel\",\"ts\":1e308,\"dur\":1}]}",
       "bad \"ts\""},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    const EtImport r = import(c.et, c.kineto);
    ASSERT_NE(r.error, "");
    EXPECT_NE(r.error.find(c.expected), std::string::npos) << r.error;
    EXPECT_NE(r.error.find(c.kineto.empty() ? "test.et.json" : "kineto"), std::string::npos) << r.error;
    EXPECT_EQ(r.error.find('\n'), std::string::npos) << r.error;
    EXPECT_TRUE(r.workload.ops.empty());
  }
  EXPECT_NE(import(good, "", "tpu-v9").error.find("unknown GPU 'tpu-v9'"), std::string::npos);
}

TEST(GpuCostModel, ConvolutionsAndMatmulsByFlopsTheRestByBytes) {
  const GpuSpec a100 = *findGpu("a100-40gb");
  // A ResNet 3x3 convolution: 32x64x56x56 in, 64x64x3x3 weights.
  const std::vector<OpTensor> in = {{{32, 64, 56, 56}, 32 * 64 * 56 * 56, 4, true}, {{64, 64, 3, 3}, 64 * 64 * 9, 4, true}};
  const std::vector<OpTensor> out = {{{32, 64, 56, 56}, 32 * 64 * 56 * 56, 4, true}};
  const OpCost conv = estimateOp({"aten::cudnn_convolution", &in, &out}, a100);
  EXPECT_EQ(conv.kind, CostKind::kFlops);
  EXPECT_DOUBLE_EQ(conv.flops, 2.0 * 32 * 64 * 56 * 56 * 64 * 9);
  EXPECT_NEAR(static_cast<double>(conv.ns), conv.flops / (19.5e3 * 0.6), 1.0);
  const OpCost relu = estimateOp({"aten::relu", &out, &out}, a100);
  EXPECT_EQ(relu.kind, CostKind::kBytes);
  EXPECT_NEAR(static_cast<double>(relu.ns), 2.0 * 32 * 64 * 56 * 56 * 4 / (1555 * 0.7), 1.0);
  const OpCost h200 = estimateOp({"aten::relu", &out, &out}, *findGpu("h200"));
  EXPECT_LT(h200.ns, relu.ns) << "more bandwidth";
  const std::vector<OpTensor> none;
  EXPECT_EQ(estimateOp({"aten::view", &out, &out}, a100).ns, 0);
  EXPECT_EQ(estimateOp({"aten::add_", &none, &none}, a100).ns, 0) << "no CUDA tensor: nothing to time";
  EXPECT_FALSE(findGpu("k80").has_value());
}

}  // namespace
}  // namespace delta::tools
