// train-tables: a training job whose kernels reach their weights only through small tables of
// device pointers, for the shim's end-to-end tests of pointer tables and of a device that is
// fuller than the budget (tests/e2e/tables_e2e_test.cpp). Written against the CUDA runtime API;
// runs on cudasim.
//
// The model is a stack of --layers (at most 8) element-wise layers, out[i] = in[i] * w[i % wn]
// plus a small offset, trained with SGD and momentum against a target that changes every step.
// What it does that a shim must cope with:
//  - the weights (2 units each) are reached by the forward and backward kernels only through
//    `model_table`, a 64-byte cudaMalloc filled with cudaMemcpy from the host, and an index;
//    every --reset-every steps the table is written again with its slots rotated (the same
//    weights at other offsets; the kernels get the rotated index);
//  - the optimizer reaches the weights through `optim_table`, a device-to-device copy of the
//    model table made after each reset, and runs in place on a second stream;
//  - the weight gradients are allocated every step, and `grad_table` (their addresses, so new
//    ones every step) is copied from pinned host memory with cudaMemcpyAsync each step; a
//    gradient-norm kernel on the second stream reaches them only through it;
//  - the two streams are joined by events both ways every step; activations (8 units each) are
//    allocated when produced and freed after their last use, as without a caching allocator;
//  - a cold buffer (16 units) is read only every --cold-every steps;
//  - --hog SIZE first takes SIZE bytes of the device in --hog-chunk pieces (below the shim's
//    1 MiB threshold: unmanaged), held to the end, as other libraries' allocations would.
//
// Output, one `key: value` per line: `peak_bytes` (the most bytes of the job's own live
// allocations, the hog excluded), `loss_<step>` and `norm_<step>` (hexadecimal floats), and
// `checksum` (FNV-1a 64 of the final weights and momenta). They depend only on the arguments.
// Exit status: 0 done, 1 a CUDA call failed (named on stderr), 2 bad arguments.
#include <cuda_runtime_api.h>
#include <cudasim/cudasim.h>

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "sim_workload.h"
#include "size_arg.h"

namespace {

constexpr const char* kProgram = "train-tables";
using delta::workloads::arg;
using delta::workloads::hashedUnit;

constexpr int kMaxLayers = 8;
constexpr int kTableSlots = 8;  // every table is 64 bytes, whatever the layer count


// ---- kernels: host stubs are the symbols; the bodies run on cudasim's stream workers ----


void forward_kernel() {}
void loss_kernel() {}
void backward_kernel() {}
void norm_kernel() {}
void sgd_kernel() {}
void cold_kernel() {}

// (table, slot, in, out, n, wn)
void forward_body(void** p, dim3, dim3) {
  const float* w = arg<float* const*>(p, 0)[arg<int>(p, 1)];
  const float* in = arg<const float*>(p, 2);
  float* out = arg<float*>(p, 3);
  const uint64_t n = arg<uint64_t>(p, 4), wn = arg<uint64_t>(p, 5);
  for (uint64_t i = 0; i < n; ++i) out[i] = in[i] * w[i % wn] + 0.001f * static_cast<float>(i % 7);
}

// (out, d_out, loss, n, step): d_out = 2 (out - target) / n, loss[0] = sum of squares.
void loss_body(void** p, dim3, dim3) {
  const float* out = arg<const float*>(p, 0);
  float* d = arg<float*>(p, 1);
  float* loss = arg<float*>(p, 2);
  const uint64_t n = arg<uint64_t>(p, 3), step = arg<uint64_t>(p, 4);
  float sum = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const float target = 0.5f + 0.25f * static_cast<float>((i * 7 + step * 13) % 5);
    const float diff = out[i] - target;
    sum += diff * diff;
    d[i] = 2.0f * diff / static_cast<float>(n);
  }
  loss[0] = sum / static_cast<float>(n);
}

// (table, slot, in, d (in place: d_out becomes d_in), grad_w, n, wn)
void backward_body(void** p, dim3, dim3) {
  const float* w = arg<float* const*>(p, 0)[arg<int>(p, 1)];
  const float* in = arg<const float*>(p, 2);
  float* d = arg<float*>(p, 3);
  float* g = arg<float*>(p, 4);
  const uint64_t n = arg<uint64_t>(p, 5), wn = arg<uint64_t>(p, 6);
  std::fill(g, g + wn, 0.0f);
  for (uint64_t i = 0; i < n; ++i) g[i % wn] += d[i] * in[i];
  for (uint64_t i = 0; i < n; ++i) d[i] *= w[i % wn];
}

// (grad_table, count, wn, out): out[0] = sum of squares of every gradient.
void norm_body(void** p, dim3, dim3) {
  const float* const* grads = arg<float* const*>(p, 0);
  const int count = arg<int>(p, 1);
  const uint64_t wn = arg<uint64_t>(p, 2);
  float sum = 0;
  for (int k = 0; k < count; ++k)
    for (uint64_t j = 0; j < wn; ++j) sum += grads[k][j] * grads[k][j];
  arg<float*>(p, 3)[0] = sum;
}

// (table, slot, momentum, grad, wn): in place.
void sgd_body(void** p, dim3, dim3) {
  float* w = arg<float* const*>(p, 0)[arg<int>(p, 1)];
  float* m = arg<float*>(p, 2);
  const float* g = arg<const float*>(p, 3);
  const uint64_t wn = arg<uint64_t>(p, 4);
  for (uint64_t j = 0; j < wn; ++j) {
    m[j] = 0.9f * m[j] + g[j];
    w[j] -= 0.05f * m[j];
  }
}

// (cold, cn, table, slot, wn): the first layer's weights nudged by the cold buffer.
void cold_body(void** p, dim3, dim3) {
  const float* cold = arg<const float*>(p, 0);
  const uint64_t cn = arg<uint64_t>(p, 1);
  float* w = arg<float* const*>(p, 2)[arg<int>(p, 3)];
  const uint64_t wn = arg<uint64_t>(p, 4);
  for (uint64_t j = 0; j < wn; ++j) w[j] += 1e-4f * cold[(j * 31) % cn];
}

// (buffer, n, seed): buffer[i] = 0.9 + 0.2 * hash(seed, i) / 2^32.
void init_kernel() {}
void init_body(void** p, dim3, dim3) {
  float* b = arg<float*>(p, 0);
  const uint64_t n = arg<uint64_t>(p, 1), seed = arg<uint64_t>(p, 2);
  for (uint64_t i = 0; i < n; ++i) {
    b[i] = 0.9f + 0.2f * hashedUnit(seed, i);
  }
}

void register_kernels() {
  static const size_t forward[] = {8, 4, 8, 8, 8, 8};
  static const size_t loss[] = {8, 8, 8, 8, 8};
  static const size_t backward[] = {8, 4, 8, 8, 8, 8, 8};
  static const size_t norm[] = {8, 4, 8, 8};
  static const size_t sgd[] = {8, 4, 8, 8, 8};
  static const size_t cold[] = {8, 8, 8, 4, 8};
  static const size_t init[] = {8, 8, 8};
  auto key = [](void (*f)()) { return reinterpret_cast<const void*>(f); };
  cudasimRegisterKernel(key(forward_kernel), "tables_fwd", forward_body, 6, forward);
  cudasimRegisterKernel(key(loss_kernel), "tables_loss", loss_body, 5, loss);
  cudasimRegisterKernel(key(backward_kernel), "tables_bwd", backward_body, 7, backward);
  cudasimRegisterKernel(key(norm_kernel), "tables_norm", norm_body, 4, norm);
  cudasimRegisterKernel(key(sgd_kernel), "tables_sgd", sgd_body, 5, sgd);
  cudasimRegisterKernel(key(cold_kernel), "tables_cold", cold_body, 5, cold);
  cudasimRegisterKernel(key(init_kernel), "tables_init", init_body, 3, init);
}

void launch(void (*kernel)(), void** args, cudaStream_t stream) {
  CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), dim3(1), dim3(1), args, 0, stream));
}

// ---- the job -------------------------------------------------------------------------------

struct Options {
  uint64_t unit = 1 << 20;
  int layers = kMaxLayers;
  int steps = 6;
  uint64_t seed = 1;
  int coldEvery = 3;
  int resetEvery = 2;
  uint64_t hog = 0;
  uint64_t hogChunk = 512 << 10;
};

class Job {
 public:
  explicit Job(const Options& o) : o_(o) {}

  void run() {
    for (uint64_t taken = 0; taken < o_.hog; taken += o_.hogChunk) {
      void* p = nullptr;
      CHECK(cudaMalloc(&p, std::min(o_.hogChunk, o_.hog - taken)));
      hog_.push_back(p);
    }
    CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&optimizer_, cudaStreamNonBlocking));
    CHECK(cudaEventCreateWithFlags(&gradsReady_, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&stepDone_, cudaEventDisableTiming));
    wn_ = 2 * o_.unit / sizeof(float);
    an_ = 8 * o_.unit / sizeof(float);
    cn_ = 16 * o_.unit / sizeof(float);
    for (int k = 0; k < o_.layers; ++k) {
      weights_[k] = allocFloats(wn_);
      momenta_[k] = allocFloats(wn_);
      init(weights_[k], wn_, o_.seed * 1000 + static_cast<uint64_t>(k), compute_);
      CHECK(cudaMemsetAsync(momenta_[k], 0, wn_ * sizeof(float), compute_));
    }
    cold_ = allocFloats(cn_);
    init(cold_, cn_, o_.seed * 7777, compute_);
    modelTable_ = static_cast<float**>(allocBytes(kTableSlots * sizeof(float*)));
    optimTable_ = static_cast<float**>(allocBytes(kTableSlots * sizeof(float*)));
    gradTable_ = static_cast<float**>(allocBytes(kTableSlots * sizeof(float*)));
    loss_ = static_cast<float*>(allocBytes(2 * sizeof(float)));
    CHECK(cudaMallocHost(reinterpret_cast<void**>(&hostGrads_), kTableSlots * sizeof(float*)));
    CHECK(cudaMallocHost(reinterpret_cast<void**>(&hostLoss_), 2 * sizeof(float)));
    CHECK(cudaStreamSynchronize(compute_));
    setModelTable(0);

    for (int step = 0; step < o_.steps; ++step) {
      if (step > 0 && step % o_.resetEvery == 0) {
        // Nothing may read the tables while they change: both streams drain first.
        CHECK(cudaStreamSynchronize(compute_));
        CHECK(cudaStreamSynchronize(optimizer_));
        setModelTable(step / o_.resetEvery);
      }
      trainStep(step);
    }
    CHECK(cudaDeviceSynchronize());
    std::printf("peak_bytes: %" PRIu64 "\n", peak_);
    std::printf("checksum: %016" PRIx64 "\n", checksum());
    for (void* p : hog_) CHECK(cudaFree(p));
  }

 private:
  void* allocBytes(uint64_t bytes) {
    void* p = nullptr;
    CHECK(cudaMalloc(&p, bytes));
    live_ += bytes;
    peak_ = std::max(peak_, live_);
    sizes_.push_back({p, bytes});
    return p;
  }
  float* allocFloats(uint64_t n) { return static_cast<float*>(allocBytes(n * sizeof(float))); }
  void release(void* p) {
    auto it = std::find_if(sizes_.begin(), sizes_.end(), [p](const auto& s) { return s.first == p; });
    live_ -= it->second;
    sizes_.erase(it);
    CHECK(cudaFree(p));
  }

  void init(float* buffer, uint64_t n, uint64_t seed, cudaStream_t stream) {
    void* args[] = {&buffer, &n, &seed};
    launch(init_kernel, args, stream);
  }

  // Layer k's weights go in slot (k + rotation) % 8, written by a host copy; the optimizer's
  // table is a device-to-device copy of it.
  void setModelTable(int rotation) {
    rotation_ = rotation % kTableSlots;
    float* slots[kTableSlots] = {};
    for (int k = 0; k < o_.layers; ++k) slots[slotOf(k)] = weights_[k];
    CHECK(cudaMemcpy(modelTable_, slots, sizeof slots, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpyAsync(optimTable_, modelTable_, sizeof slots, cudaMemcpyDeviceToDevice, compute_));
  }
  int slotOf(int layer) const { return (layer + rotation_) % kTableSlots; }

  void trainStep(int step) {
    // The compute stream waits for the previous step's optimizer.
    if (step > 0) CHECK(cudaStreamWaitEvent(compute_, stepDone_, 0));
    std::vector<float*> acts(static_cast<size_t>(o_.layers) + 1);
    acts[0] = allocFloats(an_);
    uint64_t inputSeed = o_.seed * 31 + static_cast<uint64_t>(step);
    init(acts[0], an_, inputSeed, compute_);
    for (int k = 0; k < o_.layers; ++k) {
      acts[k + 1] = allocFloats(an_);
      int slot = slotOf(k);
      void* args[] = {&modelTable_, &slot, &acts[k], &acts[k + 1], &an_, &wn_};
      launch(forward_kernel, args, compute_);
    }
    float* d = allocFloats(an_);
    uint64_t s = static_cast<uint64_t>(step);
    {
      void* args[] = {&acts[o_.layers], &d, &loss_, &an_, &s};
      launch(loss_kernel, args, compute_);
    }
    release(acts[o_.layers]);
    float* grads[kMaxLayers] = {};
    for (int k = o_.layers - 1; k >= 0; --k) {
      grads[k] = allocFloats(wn_);
      int slot = slotOf(k);
      void* args[] = {&modelTable_, &slot, &acts[k], &d, &grads[k], &an_, &wn_};
      launch(backward_kernel, args, compute_);
      release(acts[k]);
    }
    release(d);
    // The gradients' addresses are new every step: the table is written again.
    float* slots[kTableSlots] = {};
    for (int k = 0; k < o_.layers; ++k) slots[k] = grads[k];
    std::memcpy(hostGrads_, slots, sizeof slots);
    CHECK(cudaMemcpyAsync(gradTable_, hostGrads_, sizeof slots, cudaMemcpyHostToDevice, compute_));
    CHECK(cudaEventRecord(gradsReady_, compute_));

    CHECK(cudaStreamWaitEvent(optimizer_, gradsReady_, 0));
    {
      int count = o_.layers;
      float* out = loss_ + 1;
      void* args[] = {&gradTable_, &count, &wn_, &out};
      launch(norm_kernel, args, optimizer_);
    }
    for (int k = 0; k < o_.layers; ++k) {
      int slot = slotOf(k);
      void* args[] = {&optimTable_, &slot, &momenta_[k], &grads[k], &wn_};
      launch(sgd_kernel, args, optimizer_);
    }
    if (step % o_.coldEvery == o_.coldEvery - 1) {
      int slot = slotOf(0);
      void* args[] = {&cold_, &cn_, &optimTable_, &slot, &wn_};
      launch(cold_kernel, args, optimizer_);
    }
    CHECK(cudaMemcpyAsync(hostLoss_, loss_, 2 * sizeof(float), cudaMemcpyDeviceToHost, optimizer_));
    CHECK(cudaEventRecord(stepDone_, optimizer_));
    CHECK(cudaStreamSynchronize(optimizer_));
    std::printf("loss_%d: %a\nnorm_%d: %a\n", step, static_cast<double>(hostLoss_[0]), step,
                static_cast<double>(hostLoss_[1]));
    for (int k = 0; k < o_.layers; ++k) release(grads[k]);
  }

  uint64_t checksum() {
    uint64_t hash = 0xcbf29ce484222325ull;
    std::vector<unsigned char> bytes(wn_ * sizeof(float));
    for (int k = 0; k < o_.layers; ++k)
      for (float* buffer : {weights_[k], momenta_[k]}) {
        CHECK(cudaMemcpy(bytes.data(), buffer, bytes.size(), cudaMemcpyDeviceToHost));
        for (unsigned char b : bytes) hash = (hash ^ b) * 0x100000001b3ull;
      }
    return hash;
  }

  const Options o_;
  cudaStream_t compute_ = nullptr, optimizer_ = nullptr;
  cudaEvent_t gradsReady_ = nullptr, stepDone_ = nullptr;
  uint64_t wn_ = 0, an_ = 0, cn_ = 0;
  float* weights_[kMaxLayers] = {};
  float* momenta_[kMaxLayers] = {};
  float* cold_ = nullptr;
  float** modelTable_ = nullptr;
  float** optimTable_ = nullptr;
  float** gradTable_ = nullptr;
  float* loss_ = nullptr;
  float** hostGrads_ = nullptr;
  float* hostLoss_ = nullptr;
  int rotation_ = 0;
  uint64_t live_ = 0, peak_ = 0;
  std::vector<std::pair<void*, uint64_t>> sizes_;
  std::vector<void*> hog_;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "train-tables: %s\nusage: train-tables [--unit SIZE] [--layers 1-8] [--steps N] "
               "[--seed N] [--cold-every N] [--reset-every N] [--hog SIZE] [--hog-chunk SIZE]\n",
               why.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  using delta::workloads::parse_size;
  using delta::workloads::parse_u64;
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    if (i + 1 >= argc) usage("missing value for " + name);
    const std::string value = argv[++i];
    uint64_t n = 0;
    const bool size = name == "--unit" || name == "--hog" || name == "--hog-chunk";
    if (!(size ? parse_size(value, &n) : parse_u64(value, &n)))
      usage("bad value for " + name + ": " + value);
    if (name == "--unit") o.unit = n;
    else if (name == "--layers") o.layers = static_cast<int>(n);
    else if (name == "--steps") o.steps = static_cast<int>(n);
    else if (name == "--seed") o.seed = n;
    else if (name == "--cold-every") o.coldEvery = static_cast<int>(n);
    else if (name == "--reset-every") o.resetEvery = static_cast<int>(n);
    else if (name == "--hog") o.hog = n;
    else if (name == "--hog-chunk") o.hogChunk = n;
    else usage("unknown option " + name);
  }
  if (o.layers < 1 || o.layers > kMaxLayers) usage("--layers must be 1 to 8");
  if (o.steps < 1 || o.coldEvery < 1 || o.resetEvery < 1) usage("--steps, --cold-every and --reset-every must be positive");
  if (o.unit < 4096 || o.unit % 4096 != 0) usage("--unit must be a multiple of 4 KiB");
  if (o.hogChunk == 0) usage("--hog-chunk must be positive");
  register_kernels();
  Job(o).run();
  return 0;
}
