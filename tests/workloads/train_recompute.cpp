// train-recompute: a small training framework that uses DELTA's recompute API the way a real
// one would, for the recompute tests and as an example of the API (shim/include/delta/delta.h).
//
// Model: --layers L elementwise layers over --elements N floats,
//   a_0 = x (the batch), a_i = layer(a_{i-1}, w_i), loss = 0.5 * |a_L - target|^2,
// where layer(v, w) applies v <- softsign(v * w + 0.1) --producer-work times (the knob that
// makes a producer cheap or expensive to re-run); SGD on every w_i after the whole backward.
// Each iteration allocates its activations with cudaMalloc and frees each after its last use
// in backward, so the saved activations make the peak, as in real training.
//
// With libdelta loaded (found with dlsym, so the program runs the same without it), every
// activation is registered as recomputable (--mode):
//  - callback: with a callback that re-runs the activation's producing kernel on the stream it
//    is given. The producer reads a_{i-1}, which may itself be dropped: the shim recomputes it
//    first, nested. `nested_recomputes` counts callbacks that ran inside another one.
//  - framework: framework-managed. Before a backward step the framework checks each activation
//    it will read with delta_begin_recompute and regenerates the dropped ones (inputs first),
//    then says so with delta_recomputed; a drop notifier counts the drops it was told about.
//    --forget-regenerate skips the check: a framework bug, which the shim must refuse.
//  - none: nothing registered (swap only).
// --fail-recompute-at K makes the K-th callback fail (to test that the error reaches the call);
// --retry-failed-launches then retries the launch that failed. --threads T trains T replicas at
// once, each on its own host thread and stream with seed S + r, so that threads need callbacks
// at the same time (the checksum then hashes the replicas' checksums in order).
//
// Output: `key: value` lines; `checksum` (FNV-1a 64 of the final weights' bytes) depends only
// on --layers, --elements, --iters, --seed and --producer-work: not on the mode, the shim, or
// what was recomputed. Exit status: 0 done, 1 a CUDA call failed (its error on stderr), 2 bad
// command line.
#include <cuda_runtime_api.h>
#include <cudasim/cudasim.h>
#include <dlfcn.h>

#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "delta/delta.h"

namespace {

// ---- kernels (host bodies on cudasim; one logical thread per element) ----------------------

float softsign(float v) { return v / (1.0f + std::fabs(v)); }

void layer_forward(const float*, const float*, float*, int64_t, int32_t) {}
void layer_backward(const float*, const float*, const float*, float*, float*, int64_t) {}
void init_values(float*, int64_t, uint64_t, float) {}
void loss_gradient(const float*, float*, int64_t) {}
void sgd_step(float*, const float*, int64_t, float) {}

template <typename T>
T arg(void** params, int i) {
  return *static_cast<T*>(params[i]);
}

void layer_forward_body(void** p, dim3, dim3) {
  const float* in = arg<const float*>(p, 0);
  const float* w = arg<const float*>(p, 1);
  float* out = arg<float*>(p, 2);
  const int64_t n = arg<int64_t>(p, 3);
  const int32_t work = arg<int32_t>(p, 4);
  for (int64_t k = 0; k < n; ++k) {
    float v = in[k];
    for (int32_t r = 0; r < work; ++r) v = softsign(v * w[k] + 0.1f);
    out[k] = v;
  }
}

void layer_backward_body(void** p, dim3, dim3) {
  const float* in = arg<const float*>(p, 0);
  const float* out = arg<const float*>(p, 1);
  const float* w = arg<const float*>(p, 2);
  float* d = arg<float*>(p, 3);
  float* gw = arg<float*>(p, 4);
  const int64_t n = arg<int64_t>(p, 5);
  for (int64_t k = 0; k < n; ++k) {
    // softsign'(z) = (1 - |softsign(z)|)^2, taken as if the layer applied it once.
    const float slope = (1.0f - std::fabs(out[k])) * (1.0f - std::fabs(out[k]));
    gw[k] = d[k] * slope * in[k];
    d[k] = d[k] * slope * w[k];
  }
}

void init_values_body(void** p, dim3, dim3) {
  float* v = arg<float*>(p, 0);
  const int64_t n = arg<int64_t>(p, 1);
  const uint64_t seed = arg<uint64_t>(p, 2);
  const float scale = arg<float>(p, 3);
  for (int64_t k = 0; k < n; ++k) {
    uint64_t h = (seed + static_cast<uint64_t>(k)) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    v[k] = scale * (static_cast<float>(h >> 40) / static_cast<float>(1u << 24) - 0.5f);
  }
}

void loss_gradient_body(void** p, dim3, dim3) {
  const float* out = arg<const float*>(p, 0);
  float* d = arg<float*>(p, 1);
  const int64_t n = arg<int64_t>(p, 2);
  for (int64_t k = 0; k < n; ++k) d[k] = out[k] - 0.1f * static_cast<float>(k % 7 - 3);
}

void sgd_step_body(void** p, dim3, dim3) {
  float* w = arg<float*>(p, 0);
  const float* gw = arg<const float*>(p, 1);
  const int64_t n = arg<int64_t>(p, 2);
  const float rate = arg<float>(p, 3);
  for (int64_t k = 0; k < n; ++k) w[k] -= rate * gw[k];
}

template <typename... A>
void register_kernel(void (*stub)(A...), const char* name, cudasimKernelBody body) {
  static const size_t sizes[] = {sizeof(A)...};
  cudasimRegisterKernel(reinterpret_cast<const void*>(stub), name, body,
                        static_cast<int>(sizeof...(A)), sizes);
}

__attribute__((constructor)) void register_kernels() {
  register_kernel(layer_forward, "layer_forward", layer_forward_body);
  register_kernel(layer_backward, "layer_backward", layer_backward_body);
  register_kernel(init_values, "init_values", init_values_body);
  register_kernel(loss_gradient, "loss_gradient", loss_gradient_body);
  register_kernel(sgd_step, "sgd_step", sgd_step_body);
}

// ---- CUDA calls ----------------------------------------------------------------------------

[[noreturn]] void cuda_failed(cudaError_t error, const char* call, int line) {
  std::fprintf(stderr, "train-recompute: %s failed at line %d: %s\n", call, line,
               cudaGetErrorString(error));
  std::exit(1);
}
#define CHECK(call)                                              \
  do {                                                           \
    if (cudaError_t e_ = (call); e_ != cudaSuccess) cuda_failed(e_, #call, __LINE__); \
  } while (0)

// Launches `kernel` with one logical thread per element, as nvcc's stub would.
template <typename... P, typename... A>
cudaError_t launch(void (*kernel)(P...), int64_t threads, cudaStream_t stream, A... args) {
  std::tuple<P...> values{static_cast<P>(args)...};
  void* addresses[sizeof...(P)];
  std::apply([&](auto&... value) {
    int i = 0;
    ((addresses[i++] = static_cast<void*>(&value)), ...);
  }, values);
  const unsigned block = 256;
  const dim3 grid(static_cast<unsigned>((threads + block - 1) / block));
  return cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, dim3(block), addresses, 0,
                          stream);
}
// --retry-failed-launches: a launch that fails (a recompute callback failed) is reported and
// tried once more, as a framework that handles errors would; the final checksum then shows
// that the failure corrupted nothing.
bool gRetryFailedLaunches = false;
std::atomic<int> gRetriedLaunches{0};
#define LAUNCH(kernel, threads, stream, ...)                                                    \
  do {                                                                                         \
    cudaError_t e_ = launch(kernel, threads, stream, __VA_ARGS__);                             \
    if (e_ != cudaSuccess && gRetryFailedLaunches) {                                           \
      std::printf("launch_failed: %s: %s\n", #kernel, cudaGetErrorString(e_));                 \
      ++gRetriedLaunches;                                                                      \
      e_ = launch(kernel, threads, stream, __VA_ARGS__);                                       \
    }                                                                                          \
    if (e_ != cudaSuccess) cuda_failed(e_, "launch(" #kernel ")", __LINE__);                    \
  } while (0)

// ---- the shim's API, when it is there -------------------------------------------------------

struct DeltaApi {
  decltype(&delta_register_recompute) register_recompute = nullptr;
  decltype(&delta_register_framework_managed) register_framework_managed = nullptr;
  decltype(&delta_begin_recompute) begin_recompute = nullptr;
  decltype(&delta_recomputed) recomputed = nullptr;
  decltype(&delta_set_drop_notifier) set_drop_notifier = nullptr;
  decltype(&delta_mark_iteration) mark_iteration = nullptr;
  decltype(&delta_get_stats) get_stats = nullptr;

  bool present() const { return register_recompute != nullptr; }
  static DeltaApi find() {
    DeltaApi api;
    auto get = [](auto& slot, const char* name) {
      slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(dlsym(RTLD_DEFAULT, name));
    };
    get(api.register_recompute, "delta_register_recompute");
    get(api.register_framework_managed, "delta_register_framework_managed");
    get(api.begin_recompute, "delta_begin_recompute");
    get(api.recomputed, "delta_recomputed");
    get(api.set_drop_notifier, "delta_set_drop_notifier");
    get(api.mark_iteration, "delta_mark_iteration");
    get(api.get_stats, "delta_get_stats");
    return api;
  }
};

enum class Mode { kNone, kCallback, kFramework };

struct Options {
  int layers = 6;
  int64_t elements = 1 << 18;
  int iters = 3;
  uint64_t seed = 1;
  int producer_work = 1;
  Mode mode = Mode::kCallback;
  uint64_t cost_ns = 0;  // 0: estimate from the size
  int fail_recompute_at = 0;
  bool forget_regenerate = false;
  int threads = 1;
};

// What re-running an activation's producer needs: the framework's record of the op.
struct Producer {
  const float* input = nullptr;
  const float* weights = nullptr;
  float* output = nullptr;
  int64_t elements = 0;
  int32_t work = 0;
};

thread_local int tCallbackDepth = 0;
std::atomic<int> gCallbacks{0};
std::atomic<int> gNestedCallbacks{0};
std::atomic<int> gDropNotices{0};
int gFailAt = 0;

int recompute_activation(void* context, void* pointer, size_t bytes, void* stream) {
  const auto& producer = *static_cast<const Producer*>(context);
  const int call = ++gCallbacks;
  if (tCallbackDepth > 0) ++gNestedCallbacks;
  if (call == gFailAt) return -1;
  if (pointer != producer.output || bytes != static_cast<size_t>(producer.elements) * sizeof(float))
    return -2;  // the shim handed over the wrong buffer
  ++tCallbackDepth;
  const cudaError_t error = launch(layer_forward, producer.elements, static_cast<cudaStream_t>(stream),
                                   producer.input, producer.weights, producer.output,
                                   producer.elements, producer.work);
  --tCallbackDepth;
  return error == cudaSuccess ? 0 : -3;
}

void count_drop(void*, void*, size_t) { ++gDropNotices; }

int parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string_view flag = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "train-recompute: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    auto number = [&](long long low, long long high) {
      const char* text = value();
      char* end = nullptr;
      const long long v = std::strtoll(text, &end, 10);
      if (*text == '\0' || *end != '\0' || v < low || v > high) {
        std::fprintf(stderr, "train-recompute: %s wants an integer in [%lld, %lld], not '%s'\n",
                     std::string(flag).c_str(), low, high, text);
        std::exit(2);
      }
      return v;
    };
    if (flag == "--layers") o.layers = static_cast<int>(number(1, 64));
    else if (flag == "--elements") o.elements = number(1, 1ll << 28);
    else if (flag == "--iters") o.iters = static_cast<int>(number(1, 1000));
    else if (flag == "--seed") o.seed = static_cast<uint64_t>(number(0, 1ll << 62));
    else if (flag == "--producer-work") o.producer_work = static_cast<int>(number(1, 1000));
    else if (flag == "--cost-ns") o.cost_ns = static_cast<uint64_t>(number(1, 1ll << 62));
    else if (flag == "--fail-recompute-at") o.fail_recompute_at = static_cast<int>(number(1, 1 << 30));
    else if (flag == "--forget-regenerate") o.forget_regenerate = true;
    else if (flag == "--retry-failed-launches") gRetryFailedLaunches = true;
    else if (flag == "--threads") o.threads = static_cast<int>(number(1, 16));
    else if (flag == "--mode") {
      std::string_view m = value();
      if (m == "none") o.mode = Mode::kNone;
      else if (m == "callback") o.mode = Mode::kCallback;
      else if (m == "framework") o.mode = Mode::kFramework;
      else {
        std::fprintf(stderr, "train-recompute: --mode is none, callback or framework\n");
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: train-recompute [--layers L] [--elements N] [--iters I] [--seed S]\n"
                   "       [--producer-work K] [--mode none|callback|framework] [--cost-ns C]\n"
                   "       [--fail-recompute-at K] [--forget-regenerate] [--retry-failed-launches]\n"
                   "       [--threads T]\n");
      return 2;
    }
  }
  return 0;
}

float* device_floats(size_t bytes, int line) {
  void* pointer = nullptr;
  if (cudaError_t e = cudaMalloc(&pointer, bytes); e != cudaSuccess) cuda_failed(e, "cudaMalloc", line);
  return static_cast<float*>(pointer);
}

uint64_t fnv1a(const void* data, size_t bytes, uint64_t hash) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 0x100000001b3ull;
  return hash;
}

// Trains one replica (its own stream, buffers and seed) and returns the hash of its weights.
uint64_t train_replica(const Options& o, const DeltaApi& delta, uint64_t seed) {
  const int64_t n = o.elements;
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  // About what re-running a producer costs on a GPU: one read and one write of the buffer at
  // ~1 TB/s, times the work per element.
  const uint64_t cost_ns = o.cost_ns ? o.cost_ns : (2 * bytes / 1000 + 1) * o.producer_work;

  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<float*> weights(o.layers + 1, nullptr), grads(o.layers + 1, nullptr);
  for (int i = 1; i <= o.layers; ++i) {
    weights[i] = device_floats(bytes, __LINE__);
    grads[i] = device_floats(bytes, __LINE__);
    LAUNCH(init_values, n, stream, weights[i], n, seed * 1000 + i, 2.0f);
  }
  float* delta_buffer = device_floats(bytes, __LINE__);

  for (int iter = 0; iter < o.iters; ++iter) {
    if (delta.mark_iteration && o.threads == 1) delta.mark_iteration();
    std::vector<float*> act(o.layers + 1, nullptr);
    std::vector<Producer> producers(o.layers + 1);  // outlive the registrations
    act[0] = device_floats(bytes, __LINE__);
    LAUNCH(init_values, n, stream, act[0], n, seed * 7919 + iter, 4.0f);
    // Framework-managed: regenerate what was dropped, inputs first, before any use.
    auto ensure = [&](auto& self, int i) -> void {
      if (i == 0 || !delta.present() || o.mode != Mode::kFramework || o.forget_regenerate) return;
      if (delta.begin_recompute(act[i]) != 1) return;
      self(self, i - 1);
      const Producer& p = producers[i];
      LAUNCH(layer_forward, n, stream, p.input, p.weights, p.output, n, p.work);
      delta.recomputed(act[i]);
    };

    for (int i = 1; i <= o.layers; ++i) {
      act[i] = device_floats(bytes, __LINE__);
      ensure(ensure, i - 1);  // allocating a_i may have dropped a_{i-1}
      LAUNCH(layer_forward, n, stream, act[i - 1], weights[i], act[i], n, o.producer_work);
      producers[i] = Producer{act[i - 1], weights[i], act[i], n, o.producer_work};
      if (!delta.present()) continue;
      if (o.mode == Mode::kCallback)
        delta.register_recompute(act[i], cost_ns, recompute_activation, &producers[i]);
      else if (o.mode == Mode::kFramework)
        delta.register_framework_managed(act[i], cost_ns);
    }

    ensure(ensure, o.layers);
    LAUNCH(loss_gradient, n, stream, act[o.layers], delta_buffer, n);
    for (int i = o.layers; i >= 1; --i) {
      ensure(ensure, i);
      ensure(ensure, i - 1);
      LAUNCH(layer_backward, n, stream, act[i - 1], act[i], weights[i], delta_buffer, grads[i], n);
      CHECK(cudaFree(act[i]));  // its last use: layer i + 1's step read it as input before
    }
    CHECK(cudaFree(act[0]));
    for (int i = 1; i <= o.layers; ++i) LAUNCH(sgd_step, n, stream, weights[i], grads[i], n, 0.01f);
  }

  CHECK(cudaStreamSynchronize(stream));
  std::vector<float> host(static_cast<size_t>(n));
  uint64_t checksum = 0xcbf29ce484222325ull;
  for (int i = 1; i <= o.layers; ++i) {
    CHECK(cudaMemcpy(host.data(), weights[i], bytes, cudaMemcpyDeviceToHost));
    checksum = fnv1a(host.data(), bytes, checksum);
    CHECK(cudaFree(weights[i]));
    CHECK(cudaFree(grads[i]));
  }
  CHECK(cudaFree(delta_buffer));
  CHECK(cudaStreamDestroy(stream));
  return checksum;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (int status = parse(argc, argv, o)) return status;
  gFailAt = o.fail_recompute_at;
  const DeltaApi delta = DeltaApi::find();
  if (delta.present() && o.mode == Mode::kFramework) delta.set_drop_notifier(count_drop, nullptr);

  // Replica r trains with seed S + r; the checksum hashes the replicas' hashes in order.
  std::vector<uint64_t> hashes(static_cast<size_t>(o.threads));
  std::vector<std::thread> threads;
  for (int r = 1; r < o.threads; ++r)
    threads.emplace_back([&, r] { hashes[r] = train_replica(o, delta, o.seed + r); });
  hashes[0] = train_replica(o, delta, o.seed);
  for (std::thread& thread : threads) thread.join();
  uint64_t checksum = hashes[0];
  if (o.threads > 1) checksum = fnv1a(hashes.data(), hashes.size() * sizeof(uint64_t), 0xcbf29ce484222325ull);

  std::printf("checksum: %016" PRIx64 "\n", checksum);
  std::printf("shim: %s\n", delta.present() ? "present" : "absent");
  std::printf("recompute_callbacks: %d\n", gCallbacks.load());
  std::printf("nested_recomputes: %d\n", gNestedCallbacks.load());
  std::printf("drop_notices: %d\n", gDropNotices.load());
  std::printf("retried_launches: %d\n", gRetriedLaunches.load());
  if (delta.get_stats) {
    delta_stats stats{};
    if (delta.get_stats(&stats, sizeof stats) == 0)
      std::printf("delta_evictions: %" PRIu64 "\ndelta_drops: %" PRIu64 "\ndelta_recomputes: %" PRIu64
                  "\ndelta_recompute_failures: %" PRIu64 "\n",
                  stats.evictions, stats.drops, stats.recomputes, stats.recompute_failures);
  }
  return 0;
}
