// train-async: a training job that allocates through the stream-ordered allocator and a pitched
// allocation, for the shim's end-to-end tests of those paths (tests/e2e/alloc_paths_e2e_test.cpp).
// Written against the CUDA runtime API; runs on cudasim.
//
// The model is a stack of --layers (at most 8) element-wise layers, out[i] = in[i] * w[i % wn]
// plus a row of a pitched embedding table, trained with SGD and momentum. What it does that a
// shim must cope with:
//  - a user pool (cudaMemPoolCreate) with a release threshold; the weights, momenta and the
//    activations come from it (cudaMallocFromPoolAsync), the gradients from the device's
//    current pool (cudaMallocAsync);
//  - two streams joined by events both ways every step: the compute stream allocates and frees
//    the activations in stream order (cudaFreeAsync after their last use, so the pool may hand
//    their memory to the next one at once); the gradients are allocated on the compute stream
//    and freed on the optimizer stream, after the optimizer used them;
//  - every --trim-every steps, cudaMemPoolTrimTo(pool, 0) once both streams are drained;
//  - the embedding table is a cudaMallocPitch allocation (rows of wn floats at the returned
//    pitch), updated in place; a cudaMalloc3D buffer holds a copy of it made with
//    cudaMemcpy2DAsync, read back for the checksum;
//  - --capped-pool: the user pool has a maximum size (a property a shim cannot honour by
//    standing in for the pool: it must leave the pool's allocations to the pool).
//
// Output, one `key: value` per line: `peak_bytes` (the most bytes of the job's own live
// allocations, pitched ones at their pitch), `loss_<step>` (hexadecimal floats), and `checksum`
// (FNV-1a 64 of the final weights, momenta and embedding table). They depend only on the
// arguments. Exit status: 0 done, 1 a CUDA call failed (named on stderr), 2 bad arguments.
#include <cuda_runtime_api.h>
#include <cudasim/cudasim.h>

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "sim_workload.h"
#include "size_arg.h"

namespace {

constexpr const char* kProgram = "train-async";
using delta::workloads::arg;
using delta::workloads::hashedUnit;

constexpr int kMaxLayers = 8;



void forward_kernel() {}
void loss_kernel() {}
void backward_kernel() {}
void sgd_kernel() {}
void embed_kernel() {}
void init_kernel() {}

// (w, in, out, n, wn, embed, pitch, row)
void forward_body(void** p, dim3, dim3) {
  const float* w = arg<const float*>(p, 0);
  const float* in = arg<const float*>(p, 1);
  float* out = arg<float*>(p, 2);
  const uint64_t n = arg<uint64_t>(p, 3), wn = arg<uint64_t>(p, 4);
  const float* e = reinterpret_cast<const float*>(arg<const char*>(p, 5) +
                                                  arg<uint64_t>(p, 6) * arg<uint64_t>(p, 7));
  for (uint64_t i = 0; i < n; ++i) out[i] = in[i] * w[i % wn] + 0.01f * e[i % wn];
}

// (out, d, loss, n, step)
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

// (w, in, d (in place), grad, n, wn)
void backward_body(void** p, dim3, dim3) {
  const float* w = arg<const float*>(p, 0);
  const float* in = arg<const float*>(p, 1);
  float* d = arg<float*>(p, 2);
  float* g = arg<float*>(p, 3);
  const uint64_t n = arg<uint64_t>(p, 4), wn = arg<uint64_t>(p, 5);
  std::fill(g, g + wn, 0.0f);
  for (uint64_t i = 0; i < n; ++i) g[i % wn] += d[i] * in[i];
  for (uint64_t i = 0; i < n; ++i) d[i] *= w[i % wn];
}

// (w, m, g, wn)
void sgd_body(void** p, dim3, dim3) {
  float* w = arg<float*>(p, 0);
  float* m = arg<float*>(p, 1);
  const float* g = arg<const float*>(p, 2);
  const uint64_t wn = arg<uint64_t>(p, 3);
  for (uint64_t j = 0; j < wn; ++j) {
    m[j] = 0.9f * m[j] + g[j];
    w[j] -= 0.05f * m[j];
  }
}

// (embed, pitch, row, g, wn): one row nudged by a gradient.
void embed_body(void** p, dim3, dim3) {
  float* e = reinterpret_cast<float*>(arg<char*>(p, 0) + arg<uint64_t>(p, 1) * arg<uint64_t>(p, 2));
  const float* g = arg<const float*>(p, 3);
  const uint64_t wn = arg<uint64_t>(p, 4);
  for (uint64_t j = 0; j < wn; ++j) e[j] -= 0.01f * g[j];
}

// (buffer, n, seed)
void init_body(void** p, dim3, dim3) {
  float* b = arg<float*>(p, 0);
  const uint64_t n = arg<uint64_t>(p, 1), seed = arg<uint64_t>(p, 2);
  for (uint64_t i = 0; i < n; ++i) {
    b[i] = 0.9f + 0.2f * hashedUnit(seed, i);
  }
}

void register_kernels() {
  static const size_t forward[] = {8, 8, 8, 8, 8, 8, 8, 8};
  static const size_t loss[] = {8, 8, 8, 8, 8};
  static const size_t backward[] = {8, 8, 8, 8, 8, 8};
  static const size_t sgd[] = {8, 8, 8, 8};
  static const size_t embed[] = {8, 8, 8, 8, 8};
  static const size_t init[] = {8, 8, 8};
  auto key = [](void (*f)()) { return reinterpret_cast<const void*>(f); };
  cudasimRegisterKernel(key(forward_kernel), "async_fwd", forward_body, 8, forward);
  cudasimRegisterKernel(key(loss_kernel), "async_loss", loss_body, 5, loss);
  cudasimRegisterKernel(key(backward_kernel), "async_bwd", backward_body, 6, backward);
  cudasimRegisterKernel(key(sgd_kernel), "async_sgd", sgd_body, 4, sgd);
  cudasimRegisterKernel(key(embed_kernel), "async_embed", embed_body, 5, embed);
  cudasimRegisterKernel(key(init_kernel), "async_init", init_body, 3, init);
}

void launch(void (*kernel)(), void** args, cudaStream_t stream) {
  CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), dim3(1), dim3(1), args, 0, stream));
}

struct Options {
  uint64_t unit = 1 << 20;
  int layers = 6;
  int steps = 6;
  uint64_t seed = 1;
  int trimEvery = 2;
  bool cappedPool = false;
};

class Job {
 public:
  explicit Job(const Options& o) : o_(o) {}

  void run() {
    CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&optimizer_, cudaStreamNonBlocking));
    CHECK(cudaEventCreateWithFlags(&gradsReady_, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&stepDone_, cudaEventDisableTiming));
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    if (o_.cappedPool) props.maxSize = 1ull << 40;
    CHECK(cudaMemPoolCreate(&pool_, &props));
    uint64_t threshold = 4 * o_.unit;
    CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold));

    wn_ = 2 * o_.unit / sizeof(float);
    an_ = 8 * o_.unit / sizeof(float);
    for (int k = 0; k < o_.layers; ++k) {
      weights_[k] = fromPool(wn_, compute_);
      momenta_[k] = fromPool(wn_, compute_);
      init(weights_[k], wn_, o_.seed * 1000 + static_cast<uint64_t>(k), compute_);
      CHECK(cudaMemsetAsync(momenta_[k], 0, wn_ * sizeof(float), compute_));
    }
    // The embedding table: one row per layer, wn floats each, at the pitch the driver gives.
    void* embed = nullptr;
    CHECK(cudaMallocPitch(&embed, &pitch_, wn_ * sizeof(float), static_cast<size_t>(o_.layers)));
    embed_ = static_cast<char*>(embed);
    track(embed_, pitch_ * static_cast<uint64_t>(o_.layers));
    for (int k = 0; k < o_.layers; ++k) {
      float* row = reinterpret_cast<float*>(embed_ + pitch_ * static_cast<uint64_t>(k));
      init(row, wn_, o_.seed * 4242 + static_cast<uint64_t>(k), compute_);
    }
    loss_ = fromPool(1, compute_);
    CHECK(cudaMallocHost(reinterpret_cast<void**>(&hostLoss_), sizeof(float)));

    for (int step = 0; step < o_.steps; ++step) {
      if (step > 0 && step % o_.trimEvery == 0) {
        CHECK(cudaStreamSynchronize(compute_));
        CHECK(cudaStreamSynchronize(optimizer_));
        CHECK(cudaMemPoolTrimTo(pool_, 0));
      }
      trainStep(step);
    }
    CHECK(cudaDeviceSynchronize());
    // A copy of the table in a 3D allocation (depth 1), made with a 2D copy.
    cudaPitchedPtr copy{};
    cudaExtent extent{wn_ * sizeof(float), static_cast<size_t>(o_.layers), 1};
    CHECK(cudaMalloc3D(&copy, extent));
    track(copy.ptr, copy.pitch * static_cast<uint64_t>(o_.layers));
    CHECK(cudaMemcpy2DAsync(copy.ptr, copy.pitch, embed_, pitch_, wn_ * sizeof(float),
                            static_cast<size_t>(o_.layers), cudaMemcpyDeviceToDevice, compute_));
    CHECK(cudaStreamSynchronize(compute_));
    std::printf("peak_bytes: %" PRIu64 "\n", peak_);
    std::printf("checksum: %016" PRIx64 "\n", checksum(copy));
    for (int k = 0; k < o_.layers; ++k) {
      release(weights_[k], compute_);
      release(momenta_[k], compute_);
    }
    release(loss_, compute_);
    CHECK(cudaStreamSynchronize(compute_));
    untrack(embed_);
    CHECK(cudaFree(embed_));
    untrack(copy.ptr);
    CHECK(cudaFree(copy.ptr));
    CHECK(cudaMemPoolDestroy(pool_));
  }

 private:
  void track(void* p, uint64_t bytes) {
    live_ += bytes;
    peak_ = std::max(peak_, live_);
    sizes_[p] = bytes;
  }
  void untrack(void* p) {
    live_ -= sizes_[p];
    sizes_.erase(p);
  }
  float* fromPool(uint64_t n, cudaStream_t stream) {
    void* p = nullptr;
    CHECK(cudaMallocFromPoolAsync(&p, n * sizeof(float), pool_, stream));
    track(p, n * sizeof(float));
    return static_cast<float*>(p);
  }
  float* fromCurrentPool(uint64_t n, cudaStream_t stream) {
    void* p = nullptr;
    CHECK(cudaMallocAsync(&p, n * sizeof(float), stream));
    track(p, n * sizeof(float));
    return static_cast<float*>(p);
  }
  void release(void* p, cudaStream_t stream) {
    untrack(p);
    CHECK(cudaFreeAsync(p, stream));
  }
  void init(float* buffer, uint64_t n, uint64_t seed, cudaStream_t stream) {
    void* args[] = {&buffer, &n, &seed};
    launch(init_kernel, args, stream);
  }

  void trainStep(int step) {
    if (step > 0) CHECK(cudaStreamWaitEvent(compute_, stepDone_, 0));
    std::vector<float*> acts(static_cast<size_t>(o_.layers) + 1);
    acts[0] = fromPool(an_, compute_);
    init(acts[0], an_, o_.seed * 31 + static_cast<uint64_t>(step), compute_);
    for (int k = 0; k < o_.layers; ++k) {
      acts[k + 1] = fromPool(an_, compute_);
      uint64_t row = static_cast<uint64_t>(k);
      void* args[] = {&weights_[k], &acts[k], &acts[k + 1], &an_, &wn_, &embed_, &pitch_, &row};
      launch(forward_kernel, args, compute_);
    }
    float* d = fromPool(an_, compute_);
    uint64_t s = static_cast<uint64_t>(step);
    {
      void* args[] = {&acts[o_.layers], &d, &loss_, &an_, &s};
      launch(loss_kernel, args, compute_);
    }
    CHECK(cudaMemcpyAsync(hostLoss_, loss_, sizeof(float), cudaMemcpyDeviceToHost, compute_));
    release(acts[o_.layers], compute_);
    float* grads[kMaxLayers] = {};
    for (int k = o_.layers - 1; k >= 0; --k) {
      grads[k] = fromCurrentPool(wn_, compute_);
      void* args[] = {&weights_[k], &acts[k], &d, &grads[k], &an_, &wn_};
      launch(backward_kernel, args, compute_);
      release(acts[k], compute_);  // reusable by the next allocation on this stream at once
    }
    release(d, compute_);
    CHECK(cudaEventRecord(gradsReady_, compute_));

    CHECK(cudaStreamWaitEvent(optimizer_, gradsReady_, 0));
    for (int k = 0; k < o_.layers; ++k) {
      void* args[] = {&weights_[k], &momenta_[k], &grads[k], &wn_};
      launch(sgd_kernel, args, optimizer_);
      uint64_t row = static_cast<uint64_t>(k);
      void* embedArgs[] = {&embed_, &pitch_, &row, &grads[k], &wn_};
      launch(embed_kernel, embedArgs, optimizer_);
      release(grads[k], optimizer_);  // allocated on the compute stream, freed here
    }
    CHECK(cudaEventRecord(stepDone_, optimizer_));
    CHECK(cudaStreamSynchronize(compute_));
    std::printf("loss_%d: %a\n", step, static_cast<double>(hostLoss_[0]));
  }

  uint64_t checksum(const cudaPitchedPtr& table) {
    uint64_t hash = 0xcbf29ce484222325ull;
    std::vector<unsigned char> bytes(wn_ * sizeof(float));
    auto add = [&] {
      for (unsigned char b : bytes) hash = (hash ^ b) * 0x100000001b3ull;
    };
    for (int k = 0; k < o_.layers; ++k)
      for (float* buffer : {weights_[k], momenta_[k]}) {
        CHECK(cudaMemcpy(bytes.data(), buffer, bytes.size(), cudaMemcpyDeviceToHost));
        add();
      }
    for (int k = 0; k < o_.layers; ++k) {
      CHECK(cudaMemcpy2D(bytes.data(), bytes.size(),
                         static_cast<char*>(table.ptr) + table.pitch * static_cast<uint64_t>(k),
                         table.pitch, bytes.size(), 1, cudaMemcpyDeviceToHost));
      add();
    }
    return hash;
  }

  const Options o_;
  cudaStream_t compute_ = nullptr, optimizer_ = nullptr;
  cudaEvent_t gradsReady_ = nullptr, stepDone_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  uint64_t wn_ = 0, an_ = 0;
  float* weights_[kMaxLayers] = {};
  float* momenta_[kMaxLayers] = {};
  char* embed_ = nullptr;
  size_t pitch_ = 0;
  float* loss_ = nullptr;
  float* hostLoss_ = nullptr;
  uint64_t live_ = 0, peak_ = 0;
  std::map<void*, uint64_t> sizes_;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "train-async: %s\nusage: train-async [--unit SIZE] [--layers 1-8] [--steps N] "
               "[--seed N] [--trim-every N] [--capped-pool 0|1]\n",
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
    const bool size = name == "--unit";
    if (!(size ? parse_size(value, &n) : parse_u64(value, &n)))
      usage("bad value for " + name + ": " + value);
    if (name == "--unit") o.unit = n;
    else if (name == "--layers") o.layers = static_cast<int>(n);
    else if (name == "--steps") o.steps = static_cast<int>(n);
    else if (name == "--seed") o.seed = n;
    else if (name == "--trim-every") o.trimEvery = static_cast<int>(n);
    else if (name == "--capped-pool") o.cappedPool = n != 0;
    else usage("unknown option " + name);
  }
  if (o.layers < 1 || o.layers > kMaxLayers) usage("--layers must be 1 to 8");
  if (o.steps < 1 || o.trimEvery < 1) usage("--steps and --trim-every must be positive");
  if (o.unit < 4096 || o.unit % 4096 != 0) usage("--unit must be a multiple of 4 KiB");
  register_kernels();
  Job(o).run();
  return 0;
}
