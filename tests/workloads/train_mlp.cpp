// train-mlp: a small MLP training job written against the CUDA runtime API the way a framework
// drives a GPU, for the DELTA demo and end-to-end tests (and for cudasim, which it exercises).
//
// Model (--layers N hidden layers, default 2):
//   x[rows, 8] -> Linear(8, 16) -> act_1 -> Linear(16, 16) -> act_2 -> ... -> act_N
//   -> Linear(16, 1) -> mean squared error against a fixed teacher function of x;
// SGD with momentum. Hidden activations alternate leaky ReLU (odd k) and softsign (even k), so
// the default is 8-16-16-1 with leaky ReLU then softsign, the model this program always had
// (same checksums).
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
//  - cudaMemsetAsync zeroing the gradients; the loss copied back every iteration;
//  - with --threads T, T host threads each training an independent replica (own streams,
//    events, allocations and seed) at once, as data-loader or multi-model jobs do.
//
// Sizing: --peak sets the most device memory the job's live cudaMalloc buffers should hold
// (split evenly between replicas); each replica's batch (rows) is the largest whose planned
// peak fits its share (planned_peak_bytes below). Nearly all of it is activations of narrow
// layers, so compute stays cheap on cudasim's CPU. Every hidden layer saves two [rows, 16]
// activations for backward while one kernel touches at most three such buffers, so with
// 8 or more hidden layers no launch touches more than ~17% of the peak, as in deep models
// whose saved activations make the peak; `max_launch_working_set_bytes` reports the exact
// largest (see DeviceHeap::record_use).
//
// Output: one `key: value` per line. `loss`, `grad_norm` (one per iteration) and `checksum`
// (FNV-1a 64 of the final weights' bytes) depend only on the parameters: every reduction has
// a fixed order. With T > 1 the per-replica lines carry a `_thread_<i>` suffix, and
// `checksum` hashes every replica's weights in thread order (so with T = 1 it is replica 0's).
// Replica i uses seed S + i (S = --seed), so its checksum equals that of a one-thread run with
// --seed S + i and --peak P / T. Exit status: 0 done, 1 a CUDA call failed (the call,
// file:line and CUDA's error string on stderr), 2 bad command line.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mlp_kernels.h"
#include "size_arg.h"

namespace {

constexpr const char* kProgram = "train-mlp";

// ---------------------------------------------------------------------------------------------
// Errors

const char* base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

std::thread::id g_main_thread;
std::mutex g_failure_mutex;

[[noreturn]] void cuda_failed(cudaError_t error, const std::string& call, const char* file,
                              int line) {
  // Replicas may fail at once (all out of memory): the first reports, the others wait here.
  g_failure_mutex.lock();
  std::fflush(stdout);
  std::fprintf(stderr, "%s: error: %s failed at %s:%d: %s (%s)\n", kProgram, call.c_str(),
               base_name(file), line, cudaGetErrorString(error), cudaGetErrorName(error));
  if (std::this_thread::get_id() == g_main_thread) std::exit(1);
  // exit() on a replica thread would run static destructors (the CUDA runtime's among them)
  // under the replicas still running; end the process without them.
  std::fflush(stderr);
  std::_Exit(1);
}

void check_cuda(cudaError_t error, const char* call, const char* file, int line) {
  if (error != cudaSuccess) cuda_failed(error, call, file, line);
}

#define CUDA_CHECK(call) check_cuda((call), #call, __FILE__, __LINE__)

// ---------------------------------------------------------------------------------------------
// Device memory, counted: the job's own measure of its live cudaMalloc bytes and their peak,
// for each replica and for all of them together, and of the buffers each operation touches.

// Live bytes of every replica together (replicas allocate concurrently).
class MemoryTotal {
 public:
  void add(uint64_t bytes) {
    std::lock_guard lock(mutex_);
    live_ += bytes;
    peak_ = std::max(peak_, live_);
  }
  void remove(uint64_t bytes) {
    std::lock_guard lock(mutex_);
    live_ -= bytes;
  }
  uint64_t peak() const {
    std::lock_guard lock(mutex_);
    return peak_;
  }

 private:
  mutable std::mutex mutex_;
  uint64_t live_ = 0;
  uint64_t peak_ = 0;
};

// One replica's buffers. Not thread-safe: a replica's host thread is its only user.
class DeviceHeap {
 public:
  explicit DeviceHeap(MemoryTotal* total) : total_(total) {}

  template <typename T>
  T* allocate(int64_t count, const char* name, int line) {
    const size_t bytes = static_cast<size_t>(count) * sizeof(T);
    void* p = nullptr;
    const cudaError_t error = cudaMalloc(&p, bytes);
    if (error != cudaSuccess) {
      cuda_failed(error, "cudaMalloc(" + std::string(name) + ", " + std::to_string(bytes) +
                             " bytes)", __FILE__, line);
    }
    sizes_[reinterpret_cast<uintptr_t>(p)] = bytes;
    live_ += bytes;
    if (live_ > peak_) peak_ = live_;
    total_->add(bytes);
    return static_cast<T*>(p);
  }

  // cudaFree waits for the device to finish what uses the buffer, as on a GPU.
  template <typename T>
  void release(T*& p, int line) {
    if (p == nullptr) return;
    const auto it = sizes_.find(reinterpret_cast<uintptr_t>(p));
    const cudaError_t error = cudaFree(p);
    if (error != cudaSuccess) cuda_failed(error, "cudaFree", __FILE__, line);
    live_ -= it->second;
    total_->remove(it->second);
    sizes_.erase(it);
    p = nullptr;
  }

  // One kernel launch, copy or memset touches the live buffers that contain `pointers`
  // (interior pointers count; pointers outside this heap, such as pinned host memory, do
  // not): the sum of their distinct sizes is that operation's working set, which a memory
  // shim must make resident at once. Records the largest.
  void record_use(const std::vector<const void*>& pointers) {
    std::vector<std::pair<uintptr_t, size_t>> buffers;
    for (const void* pointer : pointers) {
      const auto address = reinterpret_cast<uintptr_t>(pointer);
      auto it = sizes_.upper_bound(address);
      if (it == sizes_.begin()) continue;
      --it;
      if (address < it->first + it->second) buffers.emplace_back(*it);
    }
    std::sort(buffers.begin(), buffers.end());
    buffers.erase(std::unique(buffers.begin(), buffers.end()), buffers.end());
    uint64_t bytes = 0;
    for (const auto& buffer : buffers) bytes += buffer.second;
    max_working_set_ = std::max(max_working_set_, bytes);
  }

  uint64_t live() const { return live_; }
  uint64_t peak() const { return peak_; }
  uint64_t max_working_set() const { return max_working_set_; }

 private:
  MemoryTotal* total_;
  std::map<uintptr_t, size_t> sizes_;  // ordered: record_use finds the buffer around a pointer
  uint64_t live_ = 0;
  uint64_t peak_ = 0;
  uint64_t max_working_set_ = 0;
};

#define DEVICE_ALLOC(heap, type, count, name) (heap).allocate<type>((count), name, __LINE__)
#define DEVICE_FREE(heap, p) (heap).release((p), __LINE__)

// ---------------------------------------------------------------------------------------------
// Kernel launches, the way nvcc's stub for kernel<<<grid, block, 0, stream>>>(args...) does
// it: each argument converted to the parameter's type, its address passed to cudaLaunchKernel.
// Each launch's working set is recorded: the buffers its pointer arguments point into, plus
// `indirect`, the buffers it reaches through tables of pointers.

constexpr unsigned kBlockThreads = 256;

// --kernel-handles: launch as nvcc 13's <<<>>> does, through a kernel handle (cudaGetKernel once
// per kernel, then __cudaLaunchKernel), which the runtime reports to CUPTI as a
// cudaLaunchKernel whose `func` is the handle, not the stub.
bool gLaunchByKernelHandle = false;

}  // namespace
extern "C" cudaError_t CUDARTAPI __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim,
                                                    dim3 blockDim, void** args, size_t sharedMem,
                                                    cudaStream_t stream);
namespace {

cudaError_t launch_by_handle(const void* kernel, dim3 grid, dim3 block, void** args,
                             cudaStream_t stream) {
  // One handle per kernel, asked once, as each of nvcc's stubs keeps its own.
  static std::mutex mutex;
  static std::unordered_map<const void*, cudaKernel_t> handles;
  cudaKernel_t handle = nullptr;
  {
    std::lock_guard lock(mutex);
    cudaKernel_t& slot = handles[kernel];
    if (slot == nullptr) {
      if (const cudaError_t got = cudaGetKernel(&slot, kernel); got != cudaSuccess) return got;
    }
    handle = slot;
  }
  return __cudaLaunchKernel(handle, grid, block, args, 0, stream);
}

template <typename Tuple, size_t... I>
std::array<void*, sizeof...(I)> argument_addresses(Tuple& values, std::index_sequence<I...>) {
  return {static_cast<void*>(&std::get<I>(values))...};
}

template <typename T>
void add_if_pointer(std::vector<const void*>& touched, const T& value) {
  if constexpr (std::is_pointer_v<T>) touched.push_back(static_cast<const void*>(value));
}

template <typename... P, typename... A>
void launch_kernel(DeviceHeap& heap, const std::vector<const void*>& indirect, const char* text,
                   const char* file, int line, void (*kernel)(P...), int64_t threads,
                   cudaStream_t stream, A... args) {
  static_assert(sizeof...(P) == sizeof...(A), "wrong number of kernel arguments");
  std::tuple<P...> values{static_cast<P>(args)...};
  std::vector<const void*> touched = indirect;
  std::apply([&](const auto&... value) { (add_if_pointer(touched, value), ...); }, values);
  heap.record_use(touched);
  auto addresses = argument_addresses(values, std::index_sequence_for<P...>());
  const int64_t blocks = (threads + kBlockThreads - 1) / kBlockThreads;
  const dim3 grid(static_cast<unsigned>(blocks > 0 ? blocks : 1));
  const dim3 block(kBlockThreads);
  const cudaError_t error =
      gLaunchByKernelHandle
          ? launch_by_handle(reinterpret_cast<const void*>(kernel), grid, block,
                             addresses.data(), stream)
          : cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block,
                             addresses.data(), 0, stream);
  if (error != cudaSuccess) {
    cuda_failed(error, std::string("cudaLaunchKernel(") + text + ")", file, line);
  }
  // As frameworks do after every launch (PyTorch's C10_CUDA_KERNEL_LAUNCH_CHECK): an error
  // left by anyone's call on this thread fails here.
  if (const cudaError_t last = cudaGetLastError(); last != cudaSuccess) {
    cuda_failed(last, std::string("cudaGetLastError() after ") + text, file, line);
  }
}

#define LAUNCH(heap, kernel, threads, stream, ...)                                         \
  launch_kernel((heap), {}, #kernel, __FILE__, __LINE__, kernel, threads, stream, __VA_ARGS__)
#define LAUNCH_INDIRECT(heap, indirect, kernel, threads, stream, ...)                          \
  launch_kernel((heap), (indirect), #kernel, __FILE__, __LINE__, kernel, threads, stream, \
                __VA_ARGS__)

// ---------------------------------------------------------------------------------------------
// Model shape and the peak it plans for

constexpr int kIn = 8;
constexpr int kHidden = 16;
constexpr int kOut = 1;
constexpr int kDefaultHiddenLayers = 2;  // 8-16-16-1, the model before --layers existed
constexpr int kMaxHiddenLayers = 64;
constexpr int kMaxThreads = 16;
// Rows per reduction chunk: reductions sum per chunk, then the chunks in order.
constexpr int64_t kChunkRows = 4096;
constexpr int64_t kMinRows = 256;
constexpr float kLearningRate = 0.05f;
constexpr float kMomentum = 0.9f;

// Linear layers l = 0 .. hidden_layers: width(l) inputs, width(l + 1) outputs. Parameter p is
// layer p / 2's weight (even p, [in][out]) or bias (odd p, [out]).
struct ModelShape {
  int hidden_layers = kDefaultHiddenLayers;

  int layers() const { return hidden_layers + 1; }
  int params() const { return 2 * layers(); }
  int width(int i) const { return i == 0 ? kIn : i == layers() ? kOut : kHidden; }
  int64_t param_count(int p) const {
    const int layer = p / 2;
    return p % 2 == 0 ? int64_t{width(layer)} * width(layer + 1) : width(layer + 1);
  }
  // Floats per chunk of a layer's gradient partials: [in + 1][out], the bias as input `in`.
  int64_t partial_stride(int layer) const {
    return int64_t{width(layer) + 1} * width(layer + 1);
  }
  std::string describe() const {
    std::string text = std::to_string(width(0));
    for (int i = 1; i <= layers(); ++i) text += "-" + std::to_string(width(i));
    return text;
  }
};

int64_t elementwise_threads(int64_t count) {
  return (count + mlp::kElementsPerThread - 1) / mlp::kElementsPerThread;
}

int64_t chunks_of(int64_t rows) { return (rows + kChunkRows - 1) / kChunkRows; }

// The most bytes of live cudaMalloc buffers one replica holds, following train_replica() step
// by step: the persistent tensors plus the larger of two moments of an iteration (marked
// there). Everything else an iteration does holds less: backward frees a layer's saved pair
// before it allocates the next activation gradient.
uint64_t planned_peak_bytes(int64_t rows, const ModelShape& shape) {
  const int64_t chunks = chunks_of(rows);
  const int64_t saved = 2 * int64_t{shape.hidden_layers} * kHidden;  // h_k and a_k per row
  int64_t fixed =
      shape.params() * static_cast<int64_t>(sizeof(mlp::ParamSlot)) + 2 * sizeof(float);
  for (int p = 0; p < shape.params(); ++p) fixed += 3 * shape.param_count(p) * sizeof(float);
  // Moment A, the loss: x, y, every h_k and a_k, p, dp and the loss partials.
  const int64_t moment_a =
      (rows * (kIn + kOut + saved + 2 * kOut) + chunks) * int64_t{sizeof(float)};
  // Moment B, the first activation gradient: x, every h_k and a_k, dp, the loss partials,
  // every layer's gradient partials, their table and da_N.
  int64_t partials = 0;
  for (int l = 0; l < shape.layers(); ++l) partials += chunks * shape.partial_stride(l);
  const int64_t moment_b =
      (rows * (kIn + saved + kOut + kHidden) + chunks + partials) * int64_t{sizeof(float)} +
      shape.params() * int64_t{sizeof(mlp::PartialSlot)};
  return static_cast<uint64_t>(fixed + std::max(moment_a, moment_b));
}

// The largest batch whose planned peak fits in peak_bytes (0 if none of kMinRows does).
int64_t rows_for_peak(uint64_t peak_bytes, const ModelShape& shape) {
  if (planned_peak_bytes(kMinRows, shape) > peak_bytes) return 0;
  int64_t lo = kMinRows, hi = kMinRows;
  while (planned_peak_bytes(hi * 2, shape) <= peak_bytes && hi < (int64_t{1} << 40)) hi *= 2;
  hi *= 2;  // planned(hi) > peak >= planned(lo)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (planned_peak_bytes(mid, shape) <= peak_bytes ? lo : hi) = mid;
  }
  return lo;
}

// Calls f(integral_constant<In>, integral_constant<Out>) for the linear layer shapes the model
// has (the instantiations mlp_kernels_sim.cpp and mlp_kernels.cu provide).
template <typename F>
void with_linear_shape(int in, int out, F&& f) {
  using std::integral_constant;
  if (in == kIn && out == kHidden) {
    f(integral_constant<int, kIn>(), integral_constant<int, kHidden>());
  } else if (in == kHidden && out == kHidden) {
    f(integral_constant<int, kHidden>(), integral_constant<int, kHidden>());
  } else if (in == kHidden && out == kOut) {
    f(integral_constant<int, kHidden>(), integral_constant<int, kOut>());
  } else {
    std::fprintf(stderr, "%s: no linear kernel for shape %d x %d\n", kProgram, in, out);
    std::abort();
  }
}

// Hidden activation k (1-based) is leaky ReLU for odd k, softsign for even k.
bool leaky_activation(int hidden) { return hidden % 2 == 1; }

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

constexpr uint64_t kFnvBasis = 0xCBF29CE484222325ull;

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
  int hidden_layers = kDefaultHiddenLayers;
  int threads = 1;
  bool kernel_handles = false;
};

void print_usage(FILE* out) {
  std::fprintf(out,
      "usage: %s [--peak SIZE] [--iters N] [--seed S] [--layers N] [--threads T]\n"
      "          [--kernel-handles]\n"
      "Trains a small MLP on the GPU through the CUDA runtime API and prints, one `key: value`\n"
      "per line, the loss of every iteration and a checksum of the final weights.\n"
      "  --peak SIZE  device memory the job's live buffers peak at; the batch is sized to fit\n"
      "               (bytes, or with a K, M, G or T suffix: 1024-based; default 256M)\n"
      "  --iters N    training iterations (default 5)\n"
      "  --seed S     seed of the weights and the data (default 1)\n"
      "  --layers N   hidden layers of width 16, 1 to %d (default %d); from 8 on, no kernel\n"
      "               touches more than about a fifth of the peak\n"
      "  --threads T  host threads, 1 to %d (default 1), each training its own replica with\n"
      "               seed S + thread index and an equal share of the peak\n"
      "  --kernel-handles  launch through kernel handles (cudaGetKernel, __cudaLaunchKernel), as\n"
      "               nvcc 13's <<<>>> does, instead of cudaLaunchKernel with the stub\n"
      "Exit status: 0 done, 1 a CUDA call failed, 2 bad command line.\n",
      kProgram, kMaxHiddenLayers, kDefaultHiddenLayers, kMaxThreads);
}

[[noreturn]] void bad_argument(const std::string& message) {
  std::fprintf(stderr, "%s: bad argument: %s (try --help)\n", kProgram, message.c_str());
  std::exit(2);
}

using delta::workloads::parse_size;
using delta::workloads::parse_u64;

// A count in [low, high] or a bad-argument exit naming the option.
int parse_count(std::string_view name, std::string_view value, uint64_t low, uint64_t high) {
  uint64_t number = 0;
  if (!parse_u64(value, &number) || number < low || number > high) {
    bad_argument(std::string(name) + " '" + std::string(value) + "' is not a count from " +
                 std::to_string(low) + " to " + std::to_string(high));
  }
  return static_cast<int>(number);
}

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      print_usage(stdout);
      std::exit(0);
    }
    if (arg == "--kernel-handles") {
      options.kernel_handles = true;
      continue;
    }
    std::string_view value;
    const size_t eq = arg.find('=');
    const std::string_view name = arg.substr(0, eq);
    if (name != "--peak" && name != "--iters" && name != "--seed" && name != "--layers" &&
        name != "--threads") {
      bad_argument("unknown option '" + std::string(arg) + "'");
    }
    if (eq != std::string_view::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      bad_argument(std::string(name) + " needs a value");
    }
    if (name == "--peak") {
      if (!parse_size(value, &options.peak_bytes)) {
        bad_argument("--peak '" + std::string(value) + "' is not a size such as 512M or 1G");
      }
    } else if (name == "--iters") {
      options.iters = parse_count(name, value, 1, 1000000);
    } else if (name == "--layers") {
      options.hidden_layers = parse_count(name, value, 1, kMaxHiddenLayers);
    } else if (name == "--threads") {
      options.threads = parse_count(name, value, 1, kMaxThreads);
    } else {
      uint64_t number = 0;
      if (!parse_u64(value, &number)) {
        bad_argument("--seed '" + std::string(value) + "' is not a non-negative integer");
      }
      options.seed = number;
    }
  }
  return options;
}

// ---------------------------------------------------------------------------------------------
// Output: whole `key: value` lines, so that replicas printing at once do not interleave
// within a line. A replica's keys carry `_thread_<i>` when there are several.

class Reporter {
 public:
  explicit Reporter(bool per_thread) : per_thread_(per_thread) {}

  std::string key(const char* name, int thread) const {
    return per_thread_ ? std::string(name) + "_thread_" + std::to_string(thread) : name;
  }

  [[gnu::format(printf, 3, 4)]] void line(const std::string& key, const char* format, ...) const {
    char value[128];
    va_list args;
    va_start(args, format);
    std::vsnprintf(value, sizeof(value), format, args);
    va_end(args);
    std::lock_guard lock(mutex_);
    std::printf("%s: %s\n", key.c_str(), value);
    std::fflush(stdout);
  }

 private:
  bool per_thread_;
  mutable std::mutex mutex_;
};

// ---------------------------------------------------------------------------------------------
// Training

struct Streams {
  cudaStream_t copy = nullptr;     // host-to-device batches
  cudaStream_t compute = nullptr;  // forward, loss, backward
  cudaStream_t side = nullptr;     // optimizer steps and the gradient norm
};

struct ReplicaConfig {
  int index = 0;  // the thread's
  uint64_t seed = 1;
  int iters = 1;
  int64_t rows = 0;
  ModelShape shape;
};

struct ReplicaResult {
  std::vector<float> weights;  // every parameter's final values, parameter by parameter
  uint64_t peak = 0;
  uint64_t max_working_set = 0;
  size_t free_min = 0;  // the least free device memory seen (at moment B)
  double seconds = 0;
};

// Trains one replica to the end; prints its losses and gradient norms as they come.
ReplicaResult train_replica(const ReplicaConfig& config, MemoryTotal* total,
                            const Reporter& out) {
  const ModelShape& shape = config.shape;
  const int layers = shape.layers();
  const int n_params = shape.params();
  const int64_t rows = config.rows;
  const int64_t chunks = chunks_of(rows);
  const std::string loss_key = out.key("loss", config.index);
  const std::string grad_norm_key = out.key("grad_norm", config.index);
  ReplicaResult result;

  // The current device is per host thread.
  CUDA_CHECK(cudaSetDevice(0));
  {
    size_t total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&result.free_min, &total_bytes));
  }

  Streams streams;
  CUDA_CHECK(cudaStreamCreateWithFlags(&streams.copy, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&streams.compute, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&streams.side, cudaStreamNonBlocking));
  std::array<cudaEvent_t, 2> batch_copied{};  // per pinned staging buffer
  std::vector<cudaEvent_t> grad_ready(static_cast<size_t>(layers));
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
  DeviceHeap heap(total);
  std::vector<mlp::ParamSlot> params(static_cast<size_t>(n_params));
  SplitMix64 init(stream_seed(config.seed, 0));
  for (int p = 0; p < n_params; ++p) {
    const int64_t n = shape.param_count(p);
    params[p].count = n;
    params[p].weight = DEVICE_ALLOC(heap, float, n, p % 2 ? "bias" : "weight");
    params[p].velocity = DEVICE_ALLOC(heap, float, n, "velocity");
    params[p].grad = DEVICE_ALLOC(heap, float, n, "grad");
    // Weights uniform in [-1/sqrt(in), 1/sqrt(in)), biases and momentum zero.
    std::vector<float> host(static_cast<size_t>(n), 0.0f);
    if (p % 2 == 0) {
      const float scale = 1.0f / std::sqrt(static_cast<float>(shape.width(p / 2)));
      for (float& w : host) w = init.uniform() * scale;
    }
    heap.record_use({params[p].weight});
    CUDA_CHECK(cudaMemcpy(params[p].weight, host.data(), n * sizeof(float),
                          cudaMemcpyHostToDevice));
    heap.record_use({params[p].velocity});
    CUDA_CHECK(cudaMemset(params[p].velocity, 0, n * sizeof(float)));
  }
  mlp::ParamSlot* param_table = DEVICE_ALLOC(heap, mlp::ParamSlot, n_params, "param table");
  heap.record_use({param_table});
  CUDA_CHECK(cudaMemcpy(param_table, params.data(), n_params * sizeof(mlp::ParamSlot),
                        cudaMemcpyHostToDevice));
  float* scalars = DEVICE_ALLOC(heap, float, 2, "scalars");  // [0] loss, [1] gradient norm
  CUDA_CHECK(cudaDeviceSynchronize());

  // Pinned staging of the per-iteration partials table (rewritten after each iteration's sync).
  mlp::PartialSlot* host_partial_table = nullptr;
  {
    void* p = nullptr;
    CUDA_CHECK(cudaMallocHost(&p, n_params * sizeof(mlp::PartialSlot)));
    host_partial_table = static_cast<mlp::PartialSlot*>(p);
  }

  // What the optimizer's and the norm's launches reach through param_table.
  auto slot_buffers = [&](int first, int count) {
    std::vector<const void*> buffers;
    for (int q = first; q < first + count; ++q) {
      buffers.insert(buffers.end(), {params[q].weight, params[q].velocity, params[q].grad});
    }
    return buffers;
  };
  std::vector<const void*> all_grads;
  for (const auto& slot : params) all_grads.push_back(slot.grad);

  const auto start = std::chrono::steady_clock::now();
  generate_batch(config.seed, 0, rows, staging[0], staging[0] + rows * kIn);

  // Saved activations of the hidden layers: h[k] = Linear_k(input), a[k] = act_k(h[k]).
  std::vector<float*> h(static_cast<size_t>(shape.hidden_layers), nullptr);
  std::vector<float*> a(static_cast<size_t>(shape.hidden_layers), nullptr);
  std::vector<float*> partials(static_cast<size_t>(layers), nullptr);
  for (int it = 0; it < config.iters; ++it) {
    float* batch = staging[it % 2];
    // The batch: copied on the copy stream, the compute stream waits for it and for the
    // previous optimizer step.
    float* x = DEVICE_ALLOC(heap, float, rows * kIn, "x");
    float* y = DEVICE_ALLOC(heap, float, rows * kOut, "y");
    heap.record_use({x});
    CUDA_CHECK(cudaMemcpyAsync(x, batch, rows * kIn * sizeof(float), cudaMemcpyHostToDevice,
                               streams.copy));
    heap.record_use({y});
    CUDA_CHECK(cudaMemcpyAsync(y, batch + rows * kIn, rows * sizeof(float), cudaMemcpyHostToDevice,
                               streams.copy));
    CUDA_CHECK(cudaEventRecord(batch_copied[it % 2], streams.copy));
    CUDA_CHECK(cudaStreamWaitEvent(streams.compute, batch_copied[it % 2], 0));
    if (it > 0) CUDA_CHECK(cudaStreamWaitEvent(streams.compute, optimizer_done, 0));

    // Forward. Each layer's input stays alive for backward, as autograd saves it.
    const float* input = x;
    for (int k = 0; k < shape.hidden_layers; ++k) {
      h[k] = DEVICE_ALLOC(heap, float, rows * kHidden, "h");
      with_linear_shape(shape.width(k), kHidden, [&](auto in_width, auto out_width) {
        constexpr int in = decltype(in_width)::value, out = decltype(out_width)::value;
        LAUNCH(heap, (mlp_linear_forward<in, out>), rows, streams.compute, input,
               params[2 * k].weight, params[2 * k + 1].weight, h[k], rows);
      });
      a[k] = DEVICE_ALLOC(heap, float, rows * kHidden, "a");
      if (leaky_activation(k + 1)) {
        LAUNCH(heap, mlp_leaky_relu_forward, elementwise_threads(rows * kHidden),
               streams.compute, h[k], a[k], rows * kHidden);
      } else {
        LAUNCH(heap, mlp_softsign_forward, elementwise_threads(rows * kHidden), streams.compute,
               h[k], a[k], rows * kHidden);
      }
      input = a[k];
    }
    const int last = layers - 1;
    float* p = DEVICE_ALLOC(heap, float, rows * kOut, "p");
    LAUNCH(heap, (mlp_linear_forward<kHidden, kOut>), rows, streams.compute, input,
           params[2 * last].weight, params[2 * last + 1].weight, p, rows);

    // While the device runs the forward pass, the host prepares the next batch in the other
    // staging buffer, once the copy that last read it is done.
    if (it + 1 < config.iters) {
      float* next = staging[(it + 1) % 2];
      if (it >= 1) CUDA_CHECK(cudaEventSynchronize(batch_copied[(it + 1) % 2]));
      generate_batch(config.seed, it + 1, rows, next, next + rows * kIn);
    }

    // Loss (moment A of planned_peak_bytes).
    float* dp = DEVICE_ALLOC(heap, float, rows * kOut, "dp");
    float* loss_partials = DEVICE_ALLOC(heap, float, chunks, "loss partials");
    LAUNCH(heap, mlp_mse_loss, chunks, streams.compute, p, y, dp, loss_partials, rows,
           kChunkRows, 2.0f / static_cast<float>(rows));
    LAUNCH(heap, mlp_loss_reduce, 1, streams.compute, loss_partials, chunks,
           1.0f / static_cast<float>(rows), scalars);
    heap.record_use({scalars});
    CUDA_CHECK(cudaMemcpyAsync(&host_scalars[0], &scalars[0], sizeof(float),
                               cudaMemcpyDeviceToHost, streams.compute));
    CUDA_CHECK(cudaEventRecord(loss_ready, streams.compute));
    DEVICE_FREE(heap, p);
    DEVICE_FREE(heap, y);

    // Backward. Gradients are zeroed and then accumulated into, as autograd does; the
    // per-layer gradient partials are reduced through a table rebuilt every iteration.
    for (int q = 0; q < n_params; ++q) {
      heap.record_use({params[q].grad});
      CUDA_CHECK(cudaMemsetAsync(params[q].grad, 0, params[q].count * sizeof(float),
                                 streams.compute));
    }
    for (int l = 0; l < layers; ++l) {
      partials[l] =
          DEVICE_ALLOC(heap, float, chunks * shape.partial_stride(l), "grad partials");
      const int64_t weights = shape.param_count(2 * l);
      host_partial_table[2 * l] = {partials[l], params[2 * l].grad, weights, 0,
                                   shape.partial_stride(l), chunks};
      host_partial_table[2 * l + 1] = {partials[l], params[2 * l + 1].grad, shape.width(l + 1),
                                       weights, shape.partial_stride(l), chunks};
    }
    auto* partial_table = DEVICE_ALLOC(heap, mlp::PartialSlot, n_params, "partials table");
    heap.record_use({partial_table});
    CUDA_CHECK(cudaMemcpyAsync(partial_table, host_partial_table,
                               n_params * sizeof(mlp::PartialSlot), cudaMemcpyHostToDevice,
                               streams.compute));

    // One layer's backward: weight partials, the input gradient (the last use of the layer's
    // weights in this iteration), the reduction into the gradients; then its optimizer step
    // on the side stream.
    auto layer_backward = [&](int l, const float* layer_input, const float* dy, float* dx) {
      with_linear_shape(shape.width(l), shape.width(l + 1), [&](auto in_width, auto out_width) {
        constexpr int in = decltype(in_width)::value, out = decltype(out_width)::value;
        LAUNCH(heap, (mlp_linear_backward_weight_partials<in, out>), chunks * (in + 1),
               streams.compute, layer_input, dy, partials[l], rows, kChunkRows);
        if (dx != nullptr) {
          LAUNCH(heap, (mlp_linear_backward_data<in, out>), rows, streams.compute, dy,
                 params[2 * l].weight, dx, rows);
        }
      });
      const int64_t count = params[2 * l].count + params[2 * l + 1].count;
      const std::vector<const void*> reduced = {partials[l], params[2 * l].grad,
                                                params[2 * l + 1].grad};
      LAUNCH_INDIRECT(heap, reduced, mlp_reduce_partials, count, streams.compute, partial_table,
                      2 * l, 2, count);
      CUDA_CHECK(cudaEventRecord(grad_ready[l], streams.compute));
      CUDA_CHECK(cudaStreamWaitEvent(streams.side, grad_ready[l], 0));
      LAUNCH_INDIRECT(heap, slot_buffers(2 * l, 2), mlp_sgd_momentum, count, streams.side,
                      param_table, 2 * l, 2, count, kLearningRate, kMomentum);
      // The table keeps pointing at this buffer after it is freed; nothing reads it again.
      DEVICE_FREE(heap, partials[l]);
    };

    // Hidden layers from the last: through the linear layer above it into da, then through
    // its activation into dh, the gradient of the linear layer below.
    float* dy = dp;
    for (int k = shape.hidden_layers - 1; k >= 0; --k) {
      float* da = DEVICE_ALLOC(heap, float, rows * kHidden, "da");
      if (k == shape.hidden_layers - 1) {  // moment B of planned_peak_bytes
        size_t free_now = 0, total_now = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_now, &total_now));
        result.free_min = std::min(result.free_min, free_now);
      }
      layer_backward(k + 1, a[k], dy, da);
      DEVICE_FREE(heap, a[k]);
      DEVICE_FREE(heap, dy);
      float* dh = DEVICE_ALLOC(heap, float, rows * kHidden, "dh");
      if (leaky_activation(k + 1)) {
        LAUNCH(heap, mlp_leaky_relu_backward, elementwise_threads(rows * kHidden),
               streams.compute, da, h[k], dh, rows * kHidden);
      } else {
        LAUNCH(heap, mlp_softsign_backward, elementwise_threads(rows * kHidden),
               streams.compute, da, h[k], dh, rows * kHidden);
      }
      DEVICE_FREE(heap, da);
      DEVICE_FREE(heap, h[k]);
      dy = dh;
    }
    // The first layer: no input gradient.
    layer_backward(0, x, dy, nullptr);
    DEVICE_FREE(heap, dy);
    DEVICE_FREE(heap, x);

    // The gradient norm, after the last optimizer step, on the side stream.
    LAUNCH_INDIRECT(heap, all_grads, mlp_grad_norm, 1, streams.side, param_table, n_params,
                    scalars + 1);
    heap.record_use({scalars + 1});
    CUDA_CHECK(cudaMemcpyAsync(&host_scalars[1], &scalars[1], sizeof(float),
                               cudaMemcpyDeviceToHost, streams.side));
    CUDA_CHECK(cudaEventRecord(optimizer_done, streams.side));

    CUDA_CHECK(cudaEventSynchronize(loss_ready));
    out.line(loss_key, "%.9g", static_cast<double>(host_scalars[0]));
    CUDA_CHECK(cudaStreamSynchronize(streams.side));
    out.line(grad_norm_key, "%.9g", static_cast<double>(host_scalars[1]));
    DEVICE_FREE(heap, partial_table);
    DEVICE_FREE(heap, loss_partials);
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  for (const auto& slot : params) {
    const size_t offset = result.weights.size();
    result.weights.resize(offset + static_cast<size_t>(slot.count));
    heap.record_use({slot.weight});
    CUDA_CHECK(cudaMemcpy(result.weights.data() + offset, slot.weight,
                          slot.count * sizeof(float), cudaMemcpyDeviceToHost));
  }
  result.peak = heap.peak();
  result.max_working_set = heap.max_working_set();

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
  return result;
}

int train(const Options& options) {
  ModelShape shape;
  shape.hidden_layers = options.hidden_layers;
  const uint64_t share = options.peak_bytes / static_cast<uint64_t>(options.threads);
  const int64_t rows = rows_for_peak(share, shape);
  if (rows == 0) {
    const std::string smallest = std::to_string(planned_peak_bytes(kMinRows, shape));
    bad_argument("--peak " + std::to_string(options.peak_bytes) +
                 (options.threads == 1 ? " is below the smallest job, " + smallest + " bytes"
                                       : " shared by " + std::to_string(options.threads) +
                                             " threads is below the smallest job, " + smallest +
                                             " bytes per thread"));
  }
  const uint64_t planned = planned_peak_bytes(rows, shape);

  std::printf("workload: %s\n", kProgram);
  std::printf("peak_requested_bytes: %" PRIu64 "\n", options.peak_bytes);
  std::printf("planned_peak_bytes: %" PRIu64 "\n", planned * options.threads);
  std::printf("rows: %" PRId64 "\n", rows);  // per replica
  std::printf("layers: %s\n", shape.describe().c_str());
  std::printf("hidden_layers: %d\n", shape.hidden_layers);
  std::printf("threads: %d\n", options.threads);
  std::printf("iters: %d\n", options.iters);
  std::printf("seed: %" PRIu64 "\n", options.seed);
  std::fflush(stdout);

  CUDA_CHECK(cudaSetDevice(0));
  size_t free_start = 0, device_total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_start, &device_total));

  MemoryTotal memory;
  const Reporter out(options.threads > 1);
  std::vector<ReplicaConfig> configs(static_cast<size_t>(options.threads));
  for (int i = 0; i < options.threads; ++i) {
    // Seeds S, S + 1, ...: replica i is the one-thread job with seed S + i (wrapping).
    configs[i] = {i, options.seed + static_cast<uint64_t>(i), options.iters, rows, shape};
  }
  std::vector<ReplicaResult> results(configs.size());
  if (options.threads == 1) {
    results[0] = train_replica(configs[0], &memory, out);
  } else {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < configs.size(); ++i) {
      threads.emplace_back([&, i] { results[i] = train_replica(configs[i], &memory, out); });
    }
    for (auto& t : threads) t.join();
  }

  uint64_t max_working_set = 0;
  size_t free_min = free_start;
  double seconds = 0;
  for (const auto& r : results) {
    max_working_set = std::max(max_working_set, r.max_working_set);
    free_min = std::min(free_min, r.free_min);
    seconds = std::max(seconds, r.seconds);
  }
  std::printf("peak_live_bytes: %" PRIu64 "\n", memory.peak());
  std::printf("max_launch_working_set_bytes: %" PRIu64 "\n", max_working_set);
  std::printf("device_total_bytes: %zu\n", device_total);
  // With several replicas, the replicas' moments B need not coincide: a lower bound.
  std::printf("device_used_at_peak_bytes: %zu\n", free_start - free_min);
  std::printf("seconds: %.3f\n", seconds);

  // The checksum: FNV-1a 64 over the final weights' bytes, tensor by tensor, replica by replica
  // (FNV-1a runs over a byte stream, so with one replica it is that replica's checksum).
  uint64_t checksum = kFnvBasis;
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& weights = results[i].weights;
    const size_t bytes = weights.size() * sizeof(float);
    std::printf("checksum_thread_%zu: 0x%016" PRIx64 "\n", i,
                fnv1a64(weights.data(), bytes, kFnvBasis));
    checksum = fnv1a64(weights.data(), bytes, checksum);
  }
  std::printf("checksum: 0x%016" PRIx64 "\n", checksum);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  g_main_thread = std::this_thread::get_id();
  const Options options = parse_options(argc, argv);
  gLaunchByKernelHandle = options.kernel_handles;
  return train(options);
}
