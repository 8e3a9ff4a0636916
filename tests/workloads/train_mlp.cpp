// train-mlp: a small MLP training job written against the CUDA runtime API the way a framework
// drives a GPU, for the DELTA demo and end-to-end tests (and for cudasim, which it exercises).
//
// Model: x[rows, 8] -> Linear(8, 16) -> leaky ReLU -> Linear(16, 16) -> softsign -> Linear(16, 1)
// -> mean squared error against a fixed teacher function of x; SGD with momentum.
//
// What it does that a real job does, and a memory shim must cope with:
//  - weights, momentum and gradients allocated once; every activation, activation gradient
//    and reduction temporary allocated with cudaMalloc when produced and freed with cudaFree
//    after its last use, every iteration (PyTorch with PYTORCH_NO_CUDA_MEMORY_CACHING=1);
//  - the batch generated on the host (deterministic PRNG) into double-buffered pinned memory
//    while the device works, copied with cudaMemcpyAsync on a copy stream; the compute stream
//    waits on an event;
//  - backward on the compute stream; each layer's optimizer step on a side stream as soon as
//    its gradient is ready (events both ways), then a gradient norm on the side stream;
//  - kernels that reach tensors through tables of device pointers held in device memory (one
//    copied once with cudaMemcpy, one rebuilt and copied every iteration, with pointers to
//    buffers that are freed before the table is);
//  - cudaMemsetAsync zeroing the gradients; the loss copied back every iteration.
//
// Sizing: --peak sets the most device memory the job's live cudaMalloc buffers should hold;
// the batch (rows) is the largest whose planned peak fits (planned_peak_bytes below). Nearly
// all of it is activations of narrow layers, so compute stays cheap on cudasim's CPU.
//
// Output: one `key: value` per line. `loss`, `grad_norm` (one per iteration) and `checksum`
// (FNV-1a 64 of the final weights' bytes) depend only on the parameters: every reduction has
// a fixed order. Exit status: 0 done, 1 a CUDA call failed (the call, file:line and CUDA's
// error string on stderr), 2 bad command line.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mlp_kernels.h"

namespace {

constexpr const char* kProgram = "train-mlp";

// ---------------------------------------------------------------------------------------------
// Errors

const char* base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

[[noreturn]] void cuda_failed(cudaError_t error, const std::string& call, const char* file,
                              int line) {
  std::fflush(stdout);
  std::fprintf(stderr, "%s: error: %s failed at %s:%d: %s (%s)\n", kProgram, call.c_str(),
               base_name(file), line, cudaGetErrorString(error), cudaGetErrorName(error));
  std::exit(1);
}

void check_cuda(cudaError_t error, const char* call, const char* file, int line) {
  if (error != cudaSuccess) cuda_failed(error, call, file, line);
}

#define CUDA_CHECK(call) check_cuda((call), #call, __FILE__, __LINE__)

// ---------------------------------------------------------------------------------------------
// Kernel launches, the way nvcc's stub for kernel<<<grid, block, 0, stream>>>(args...) does
// it: each argument converted to the parameter's type, its address passed to cudaLaunchKernel.

constexpr unsigned kBlockThreads = 256;

template <typename Tuple, size_t... I>
std::array<void*, sizeof...(I)> argument_addresses(Tuple& values, std::index_sequence<I...>) {
  return {static_cast<void*>(&std::get<I>(values))...};
}

template <typename... P, typename... A>
void launch_kernel(const char* text, const char* file, int line, void (*kernel)(P...),
                   int64_t threads, cudaStream_t stream, A... args) {
  static_assert(sizeof...(P) == sizeof...(A), "wrong number of kernel arguments");
  std::tuple<P...> values{static_cast<P>(args)...};
  auto addresses = argument_addresses(values, std::index_sequence_for<P...>());
  const int64_t blocks = (threads + kBlockThreads - 1) / kBlockThreads;
  const dim3 grid(static_cast<unsigned>(blocks > 0 ? blocks : 1));
  const dim3 block(kBlockThreads);
  const cudaError_t error = cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block,
                                             addresses.data(), 0, stream);
  if (error != cudaSuccess) {
    cuda_failed(error, std::string("cudaLaunchKernel(") + text + ")", file, line);
  }
}

#define LAUNCH(kernel, threads, stream, ...) \
  launch_kernel(#kernel, __FILE__, __LINE__, kernel, threads, stream, __VA_ARGS__)

// ---------------------------------------------------------------------------------------------
// Device memory, counted: the job's own measure of its live cudaMalloc bytes and their peak.

class DeviceHeap {
 public:
  template <typename T>
  T* allocate(int64_t count, const char* name, int line) {
    const size_t bytes = static_cast<size_t>(count) * sizeof(T);
    void* p = nullptr;
    const cudaError_t error = cudaMalloc(&p, bytes);
    if (error != cudaSuccess) {
      cuda_failed(error, "cudaMalloc(" + std::string(name) + ", " + std::to_string(bytes) +
                             " bytes)", __FILE__, line);
    }
    sizes_[p] = bytes;
    live_ += bytes;
    if (live_ > peak_) peak_ = live_;
    return static_cast<T*>(p);
  }

  // cudaFree waits for the device to finish what uses the buffer, as on a GPU.
  template <typename T>
  void release(T*& p, int line) {
    if (p == nullptr) return;
    const auto it = sizes_.find(static_cast<void*>(p));
    const cudaError_t error = cudaFree(p);
    if (error != cudaSuccess) cuda_failed(error, "cudaFree", __FILE__, line);
    live_ -= it->second;
    sizes_.erase(it);
    p = nullptr;
  }

  uint64_t live() const { return live_; }
  uint64_t peak() const { return peak_; }

 private:
  std::unordered_map<void*, size_t> sizes_;
  uint64_t live_ = 0;
  uint64_t peak_ = 0;
};

#define DEVICE_ALLOC(heap, type, count, name) (heap).allocate<type>((count), name, __LINE__)
#define DEVICE_FREE(heap, p) (heap).release((p), __LINE__)

// ---------------------------------------------------------------------------------------------
// Model shape and the peak it plans for

constexpr int kIn = 8;
constexpr int kHidden = 16;
constexpr int kOut = 1;
constexpr int kLayers = 3;
constexpr std::array<int, kLayers + 1> kWidths = {kIn, kHidden, kHidden, kOut};
constexpr int kParams = 2 * kLayers;  // weight and bias per layer
// Rows per reduction chunk: reductions sum per chunk, then the chunks in order.
constexpr int64_t kChunkRows = 4096;
constexpr int64_t kMinRows = 256;
constexpr float kLearningRate = 0.05f;
constexpr float kMomentum = 0.9f;

int64_t elementwise_threads(int64_t count) {
  return (count + mlp::kElementsPerThread - 1) / mlp::kElementsPerThread;
}

int64_t chunks_of(int64_t rows) { return (rows + kChunkRows - 1) / kChunkRows; }

int64_t param_count(int p) {
  const int layer = p / 2;
  return p % 2 == 0 ? int64_t{kWidths[layer]} * kWidths[layer + 1] : kWidths[layer + 1];
}

int64_t partial_stride(int layer) { return int64_t{kWidths[layer] + 1} * kWidths[layer + 1]; }

// The most bytes of live cudaMalloc buffers one run holds, following train() step by step:
// the persistent tensors plus the larger of two moments of an iteration (marked in train()).
uint64_t planned_peak_bytes(int64_t rows) {
  const int64_t chunks = chunks_of(rows);
  int64_t fixed = kParams * static_cast<int64_t>(sizeof(mlp::ParamSlot)) + 2 * sizeof(float);
  for (int p = 0; p < kParams; ++p) fixed += 3 * param_count(p) * sizeof(float);
  // Moment A, the loss: x, y, h1, a1, h2, a2, p, dp and the loss partials.
  const int64_t moment_a =
      (rows * (kIn + kOut + 4 * kHidden + 2 * kOut) + chunks) * int64_t{sizeof(float)};
  // Moment B, the first activation gradient: x, h1, a1, h2, a2, dp, the loss partials, every
  // layer's gradient partials, their table and da2.
  int64_t partials = 0;
  for (int l = 0; l < kLayers; ++l) partials += chunks * partial_stride(l);
  const int64_t moment_b =
      (rows * (kIn + 4 * kHidden + kOut + kHidden) + chunks + partials) * int64_t{sizeof(float)} +
      kParams * int64_t{sizeof(mlp::PartialSlot)};
  return static_cast<uint64_t>(fixed + std::max(moment_a, moment_b));
}

// The largest batch whose planned peak fits in peak_bytes (0 if none of kMinRows does).
int64_t rows_for_peak(uint64_t peak_bytes) {
  if (planned_peak_bytes(kMinRows) > peak_bytes) return 0;
  int64_t lo = kMinRows, hi = kMinRows;
  while (planned_peak_bytes(hi * 2) <= peak_bytes && hi < (int64_t{1} << 40)) hi *= 2;
  hi *= 2;  // planned(hi) > peak >= planned(lo)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (planned_peak_bytes(mid) <= peak_bytes ? lo : hi) = mid;
  }
  return lo;
}

// ---------------------------------------------------------------------------------------------
// Host-side data: a deterministic stream of batches, like a data loader's.

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1) on a 2^-23 grid: exact in float, the same on every machine.
  float uniform() {
    return static_cast<float>(static_cast<int32_t>(next() >> 40) - (1 << 23)) * 0x1p-23f;
  }

 private:
  uint64_t state_;
};

uint64_t stream_seed(uint64_t seed, uint64_t stream) {
  return SplitMix64(seed ^ (stream * 0xD1B54A32D192ED03ull)).next();
}

// Fills x[rows][kIn] and y[rows] of batch `iteration`; y is the function the MLP learns.
void generate_batch(uint64_t seed, int iteration, int64_t rows, float* x, float* y) {
  SplitMix64 rng(stream_seed(seed, 1000 + static_cast<uint64_t>(iteration)));
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * kIn;
    for (int i = 0; i < kIn; ++i) xr[i] = rng.uniform();
    y[r] = 0.75f * xr[0] - 0.5f * xr[1] * xr[2] + 0.25f * xr[3] * xr[3] - 0.5f * xr[4] +
           0.125f * (xr[5] + xr[6] - xr[7]);
  }
}

uint64_t fnv1a64(const void* data, size_t bytes, uint64_t hash) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 0x100000001B3ull;
  return hash;
}

// ---------------------------------------------------------------------------------------------
// Command line

struct Options {
  uint64_t peak_bytes = 256ull << 20;
  int iters = 5;
  uint64_t seed = 1;
};

void print_usage(FILE* out) {
  std::fprintf(out,
      "usage: %s [--peak SIZE] [--iters N] [--seed S]\n"
      "Trains a small MLP on the GPU through the CUDA runtime API and prints, one `key: value`\n"
      "per line, the loss of every iteration and a checksum of the final weights.\n"
      "  --peak SIZE  device memory the job's live buffers peak at; the batch is sized to fit\n"
      "               (bytes, or with a K, M, G or T suffix: 1024-based; default 256M)\n"
      "  --iters N    training iterations (default 5)\n"
      "  --seed S     seed of the weights and the data (default 1)\n"
      "Exit status: 0 done, 1 a CUDA call failed, 2 bad command line.\n",
      kProgram);
}

[[noreturn]] void bad_argument(const std::string& message) {
  std::fprintf(stderr, "%s: bad argument: %s (try --help)\n", kProgram, message.c_str());
  std::exit(2);
}

bool parse_u64(std::string_view text, uint64_t* out) {
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out, 10);
  return ec == std::errc() && end == text.data() + text.size();
}

// "1073741824", "512K", "256M", "1G", "1GiB", "2gb": binary multiples.
bool parse_size(std::string_view text, uint64_t* out) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  uint64_t value = 0;
  if (!parse_u64(text.substr(0, digits), &value) || value == 0) return false;
  std::string suffix(text.substr(digits));
  for (char& c : suffix) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  int shift = 0;
  if (!suffix.empty() && suffix != "b") {
    const size_t unit = std::string_view("kmgt").find(suffix[0]);
    const std::string_view rest = std::string_view(suffix).substr(1);
    if (unit == std::string_view::npos || !(rest.empty() || rest == "b" || rest == "ib")) {
      return false;
    }
    shift = 10 * static_cast<int>(unit + 1);
  }
  if (value > (UINT64_MAX >> shift)) return false;
  *out = value << shift;
  return true;
}

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      print_usage(stdout);
      std::exit(0);
    }
    std::string_view value;
    const size_t eq = arg.find('=');
    const std::string_view name = arg.substr(0, eq);
    if (name != "--peak" && name != "--iters" && name != "--seed") {
      bad_argument("unknown option '" + std::string(arg) + "'");
    }
    if (eq != std::string_view::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      bad_argument(std::string(name) + " needs a value");
    }
    uint64_t number = 0;
    if (name == "--peak") {
      if (!parse_size(value, &options.peak_bytes)) {
        bad_argument("--peak '" + std::string(value) + "' is not a size such as 512M or 1G");
      }
    } else if (name == "--iters") {
      if (!parse_u64(value, &number) || number < 1 || number > 1000000) {
        bad_argument("--iters '" + std::string(value) + "' is not a count from 1 to 1000000");
      }
      options.iters = static_cast<int>(number);
    } else {
      if (!parse_u64(value, &number)) {
        bad_argument("--seed '" + std::string(value) + "' is not a non-negative integer");
      }
      options.seed = number;
    }
  }
  return options;
}

// ---------------------------------------------------------------------------------------------
// Training

struct Streams {
  cudaStream_t copy = nullptr;     // host-to-device batches
  cudaStream_t compute = nullptr;  // forward, loss, backward
  cudaStream_t side = nullptr;     // optimizer steps and the gradient norm
};

int train(const Options& options) {
  const int64_t rows = rows_for_peak(options.peak_bytes);
  if (rows == 0) {
    bad_argument("--peak " + std::to_string(options.peak_bytes) + " is below the smallest job, " +
                 std::to_string(planned_peak_bytes(kMinRows)) + " bytes");
  }
  const int64_t chunks = chunks_of(rows);

  std::printf("workload: %s\n", kProgram);
  std::printf("peak_requested_bytes: %" PRIu64 "\n", options.peak_bytes);
  std::printf("planned_peak_bytes: %" PRIu64 "\n", planned_peak_bytes(rows));
  std::printf("rows: %" PRId64 "\n", rows);
  std::printf("layers: %d-%d-%d-%d\n", kWidths[0], kWidths[1], kWidths[2], kWidths[3]);
  std::printf("iters: %d\n", options.iters);
  std::printf("seed: %" PRIu64 "\n", options.seed);
  std::fflush(stdout);

  CUDA_CHECK(cudaSetDevice(0));
  size_t free_start = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_start, &total));
  size_t free_min = free_start;

  Streams streams;
  CUDA_CHECK(cudaStreamCreateWithFlags(&streams.copy, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&streams.compute, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&streams.side, cudaStreamNonBlocking));
  std::array<cudaEvent_t, 2> batch_copied{};  // per pinned staging buffer
  std::array<cudaEvent_t, kLayers> grad_ready{};
  cudaEvent_t optimizer_done = nullptr, loss_ready = nullptr;
  for (auto& e : batch_copied) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  for (auto& e : grad_ready) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&optimizer_done, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&loss_ready, cudaEventDisableTiming));

  // Pinned host memory: two batch staging buffers ([rows][kIn] x, then [rows] y) and the
  // scalars read back every iteration.
  const size_t batch_floats = static_cast<size_t>(rows) * (kIn + 1);
  std::array<float*, 2> staging{};
  for (auto& s : staging) {
    void* p = nullptr;
    CUDA_CHECK(cudaMallocHost(&p, batch_floats * sizeof(float)));
    s = static_cast<float*>(p);
  }
  float* host_scalars = nullptr;  // [0] loss, [1] gradient norm
  {
    void* p = nullptr;
    CUDA_CHECK(cudaMallocHost(&p, 2 * sizeof(float)));
    host_scalars = static_cast<float*>(p);
  }

  // Persistent device tensors: parameters, momentum, gradients; the optimizer's table.
  DeviceHeap heap;
  std::array<mlp::ParamSlot, kParams> params{};
  SplitMix64 init(stream_seed(options.seed, 0));
  for (int p = 0; p < kParams; ++p) {
    const int64_t n = param_count(p);
    params[p].count = n;
    params[p].weight = DEVICE_ALLOC(heap, float, n, p % 2 ? "bias" : "weight");
    params[p].velocity = DEVICE_ALLOC(heap, float, n, "velocity");
    params[p].grad = DEVICE_ALLOC(heap, float, n, "grad");
    // Weights uniform in [-1/sqrt(in), 1/sqrt(in)), biases and momentum zero.
    std::vector<float> host(static_cast<size_t>(n), 0.0f);
    if (p % 2 == 0) {
      const float scale = 1.0f / std::sqrt(static_cast<float>(kWidths[p / 2]));
      for (float& w : host) w = init.uniform() * scale;
    }
    CUDA_CHECK(cudaMemcpy(params[p].weight, host.data(), n * sizeof(float),
                          cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(params[p].velocity, 0, n * sizeof(float)));
  }
  mlp::ParamSlot* param_table = DEVICE_ALLOC(heap, mlp::ParamSlot, kParams, "param table");
  CUDA_CHECK(cudaMemcpy(param_table, params.data(), sizeof(params), cudaMemcpyHostToDevice));
  float* scalars = DEVICE_ALLOC(heap, float, 2, "scalars");  // [0] loss, [1] gradient norm
  CUDA_CHECK(cudaDeviceSynchronize());

  // Pinned staging of the per-iteration partials table (rewritten after each iteration's sync).
  mlp::PartialSlot* host_partial_table = nullptr;
  {
    void* p = nullptr;
    CUDA_CHECK(cudaMallocHost(&p, kParams * sizeof(mlp::PartialSlot)));
    host_partial_table = static_cast<mlp::PartialSlot*>(p);
  }

  const auto start = std::chrono::steady_clock::now();
  generate_batch(options.seed, 0, rows, staging[0], staging[0] + rows * kIn);

  for (int it = 0; it < options.iters; ++it) {
    float* batch = staging[it % 2];
    // The batch: copied on the copy stream, the compute stream waits for it and for the
    // previous optimizer step.
    float* x = DEVICE_ALLOC(heap, float, rows * kIn, "x");
    float* y = DEVICE_ALLOC(heap, float, rows * kOut, "y");
    CUDA_CHECK(cudaMemcpyAsync(x, batch, rows * kIn * sizeof(float), cudaMemcpyHostToDevice,
                               streams.copy));
    CUDA_CHECK(cudaMemcpyAsync(y, batch + rows * kIn, rows * sizeof(float), cudaMemcpyHostToDevice,
                               streams.copy));
    CUDA_CHECK(cudaEventRecord(batch_copied[it % 2], streams.copy));
    CUDA_CHECK(cudaStreamWaitEvent(streams.compute, batch_copied[it % 2], 0));
    if (it > 0) CUDA_CHECK(cudaStreamWaitEvent(streams.compute, optimizer_done, 0));

    // Forward. Each layer's input stays alive for backward, as autograd saves it.
    float* h1 = DEVICE_ALLOC(heap, float, rows * kHidden, "h1");
    LAUNCH((mlp_linear_forward<kIn, kHidden>), rows, streams.compute, x, params[0].weight,
           params[1].weight, h1, rows);
    float* a1 = DEVICE_ALLOC(heap, float, rows * kHidden, "a1");
    LAUNCH(mlp_leaky_relu_forward, elementwise_threads(rows * kHidden), streams.compute,
           h1, a1, rows * kHidden);
    float* h2 = DEVICE_ALLOC(heap, float, rows * kHidden, "h2");
    LAUNCH((mlp_linear_forward<kHidden, kHidden>), rows, streams.compute, a1, params[2].weight,
           params[3].weight, h2, rows);
    float* a2 = DEVICE_ALLOC(heap, float, rows * kHidden, "a2");
    LAUNCH(mlp_softsign_forward, elementwise_threads(rows * kHidden), streams.compute,
           h2, a2, rows * kHidden);
    float* p = DEVICE_ALLOC(heap, float, rows * kOut, "p");
    LAUNCH((mlp_linear_forward<kHidden, kOut>), rows, streams.compute, a2, params[4].weight,
           params[5].weight, p, rows);

    // While the device runs the forward pass, the host prepares the next batch in the other
    // staging buffer, once the copy that last read it is done.
    if (it + 1 < options.iters) {
      float* next = staging[(it + 1) % 2];
      if (it >= 1) CUDA_CHECK(cudaEventSynchronize(batch_copied[(it + 1) % 2]));
      generate_batch(options.seed, it + 1, rows, next, next + rows * kIn);
    }

    // Loss (moment A of planned_peak_bytes).
    float* dp = DEVICE_ALLOC(heap, float, rows * kOut, "dp");
    float* loss_partials = DEVICE_ALLOC(heap, float, chunks, "loss partials");
    LAUNCH(mlp_mse_loss, chunks, streams.compute, p, y, dp, loss_partials, rows, kChunkRows,
           2.0f / static_cast<float>(rows));
    LAUNCH(mlp_loss_reduce, 1, streams.compute, loss_partials, chunks,
           1.0f / static_cast<float>(rows), scalars);
    CUDA_CHECK(cudaMemcpyAsync(&host_scalars[0], &scalars[0], sizeof(float),
                               cudaMemcpyDeviceToHost, streams.compute));
    CUDA_CHECK(cudaEventRecord(loss_ready, streams.compute));
    DEVICE_FREE(heap, p);
    DEVICE_FREE(heap, y);

    // Backward. Gradients are zeroed and then accumulated into, as autograd does; the
    // per-layer gradient partials are reduced through a table rebuilt every iteration.
    for (int q = 0; q < kParams; ++q) {
      CUDA_CHECK(cudaMemsetAsync(params[q].grad, 0, params[q].count * sizeof(float),
                                 streams.compute));
    }
    std::array<float*, kLayers> partials{};
    for (int l = 0; l < kLayers; ++l) {
      partials[l] = DEVICE_ALLOC(heap, float, chunks * partial_stride(l), "grad partials");
      const int64_t weights = int64_t{kWidths[l]} * kWidths[l + 1];
      host_partial_table[2 * l] = {partials[l], params[2 * l].grad, weights, 0,
                                   partial_stride(l), chunks};
      host_partial_table[2 * l + 1] = {partials[l], params[2 * l + 1].grad, kWidths[l + 1],
                                       weights, partial_stride(l), chunks};
    }
    auto* partial_table = DEVICE_ALLOC(heap, mlp::PartialSlot, kParams, "partials table");
    CUDA_CHECK(cudaMemcpyAsync(partial_table, host_partial_table,
                               kParams * sizeof(mlp::PartialSlot), cudaMemcpyHostToDevice,
                               streams.compute));

    // Layer 3 (moment B of planned_peak_bytes: the first allocation here).
    float* da2 = DEVICE_ALLOC(heap, float, rows * kHidden, "da2");
    {
      size_t free_now = 0, total_now = 0;
      CUDA_CHECK(cudaMemGetInfo(&free_now, &total_now));
      if (free_now < free_min) free_min = free_now;
    }
    // One layer's backward: weight partials, the input gradient (the last use of the layer's
    // weights in this iteration), the reduction into the gradients; then its optimizer step
    // on the side stream.
    auto layer_backward = [&](auto layer, const float* input, const float* dy, float* dx) {
      constexpr int l = decltype(layer)::value;
      constexpr int in = kWidths[l], out = kWidths[l + 1];
      LAUNCH((mlp_linear_backward_weight_partials<in, out>), chunks * (in + 1), streams.compute,
             input, dy, partials[l], rows, kChunkRows);
      if (dx != nullptr) {
        LAUNCH((mlp_linear_backward_data<in, out>), rows, streams.compute, dy,
               params[2 * l].weight, dx, rows);
      }
      const int64_t total = params[2 * l].count + params[2 * l + 1].count;
      LAUNCH(mlp_reduce_partials, total, streams.compute, partial_table, 2 * l, 2, total);
      CUDA_CHECK(cudaEventRecord(grad_ready[l], streams.compute));
      CUDA_CHECK(cudaStreamWaitEvent(streams.side, grad_ready[l], 0));
      LAUNCH(mlp_sgd_momentum, total, streams.side, param_table, 2 * l, 2, total, kLearningRate,
             kMomentum);
      // The table keeps pointing at this buffer after it is freed; nothing reads it again.
      DEVICE_FREE(heap, partials[l]);
    };
    layer_backward(std::integral_constant<int, 2>(), a2, dp, da2);
    DEVICE_FREE(heap, a2);
    DEVICE_FREE(heap, dp);
    float* dh2 = DEVICE_ALLOC(heap, float, rows * kHidden, "dh2");
    LAUNCH(mlp_softsign_backward, elementwise_threads(rows * kHidden), streams.compute,
           da2, h2, dh2, rows * kHidden);
    DEVICE_FREE(heap, da2);
    DEVICE_FREE(heap, h2);

    // Layer 2.
    float* da1 = DEVICE_ALLOC(heap, float, rows * kHidden, "da1");
    layer_backward(std::integral_constant<int, 1>(), a1, dh2, da1);
    DEVICE_FREE(heap, dh2);
    DEVICE_FREE(heap, a1);
    float* dh1 = DEVICE_ALLOC(heap, float, rows * kHidden, "dh1");
    LAUNCH(mlp_leaky_relu_backward, elementwise_threads(rows * kHidden), streams.compute,
           da1, h1, dh1, rows * kHidden);
    DEVICE_FREE(heap, da1);
    DEVICE_FREE(heap, h1);

    // Layer 1: no input gradient.
    layer_backward(std::integral_constant<int, 0>(), x, dh1, nullptr);
    DEVICE_FREE(heap, dh1);
    DEVICE_FREE(heap, x);

    // The gradient norm, after the last optimizer step, on the side stream.
    LAUNCH(mlp_grad_norm, 1, streams.side, param_table, kParams, scalars + 1);
    CUDA_CHECK(cudaMemcpyAsync(&host_scalars[1], &scalars[1], sizeof(float),
                               cudaMemcpyDeviceToHost, streams.side));
    CUDA_CHECK(cudaEventRecord(optimizer_done, streams.side));

    CUDA_CHECK(cudaEventSynchronize(loss_ready));
    std::printf("loss: %.9g\n", static_cast<double>(host_scalars[0]));
    CUDA_CHECK(cudaStreamSynchronize(streams.side));
    std::printf("grad_norm: %.9g\n", static_cast<double>(host_scalars[1]));
    std::fflush(stdout);
    DEVICE_FREE(heap, partial_table);
    DEVICE_FREE(heap, loss_partials);
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // The checksum: FNV-1a 64 over the final weights' bytes, tensor by tensor.
  uint64_t checksum = 0xCBF29CE484222325ull;
  for (const auto& slot : params) {
    std::vector<float> host(static_cast<size_t>(slot.count));
    CUDA_CHECK(cudaMemcpy(host.data(), slot.weight, slot.count * sizeof(float),
                          cudaMemcpyDeviceToHost));
    checksum = fnv1a64(host.data(), host.size() * sizeof(float), checksum);
  }

  std::printf("peak_live_bytes: %" PRIu64 "\n", heap.peak());
  std::printf("device_total_bytes: %zu\n", total);
  std::printf("device_used_at_peak_bytes: %zu\n", free_start - free_min);
  std::printf("seconds: %.3f\n", seconds);

  for (auto& slot : params) {
    DEVICE_FREE(heap, slot.weight);
    DEVICE_FREE(heap, slot.velocity);
    DEVICE_FREE(heap, slot.grad);
  }
  DEVICE_FREE(heap, param_table);
  DEVICE_FREE(heap, scalars);
  for (float* s : staging) CUDA_CHECK(cudaFreeHost(s));
  CUDA_CHECK(cudaFreeHost(host_scalars));
  CUDA_CHECK(cudaFreeHost(host_partial_table));
  for (auto& e : batch_copied) CUDA_CHECK(cudaEventDestroy(e));
  for (auto& e : grad_ready) CUDA_CHECK(cudaEventDestroy(e));
  CUDA_CHECK(cudaEventDestroy(optimizer_done));
  CUDA_CHECK(cudaEventDestroy(loss_ready));
  CUDA_CHECK(cudaStreamDestroy(streams.copy));
  CUDA_CHECK(cudaStreamDestroy(streams.compute));
  CUDA_CHECK(cudaStreamDestroy(streams.side));

  std::printf("checksum: 0x%016" PRIx64 "\n", checksum);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse_options(argc, argv);
  return train(options);
}
