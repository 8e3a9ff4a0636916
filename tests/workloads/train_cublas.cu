// train-cublas: a training loop whose matrix products are cuBLAS's (cublasSgemm), for the GPU
// check kit (scripts/gpu-check). Real CUDA only: it runs where there is a GPU; elsewhere the
// build only compiles it.
//
// Why it exists: cuBLAS is how real jobs reach the GPU, and it does so behind DELTA's back.
// It links its own static CUDA runtime, so its launches and its internal workspace
// allocations reach libdelta.so only through the driver (cuGetProcAddress, cuMemAlloc), never
// through the cudaMalloc the shim interposes in the program. A shim that only watched the
// program's runtime would miss them.
//
// Model (--layers N hidden layers of width 256): x[rows, 256] -> (Linear without bias, ReLU)
// x N -> Linear(256, 1) -> mean squared error against a fixed linear teacher; plain SGD.
// Every product is cublasSgemm; the elementwise parts are the small kernels below. As in
// train-mlp, activations are cudaMalloc'd when produced and freed after their last use, every
// iteration, and --peak sizes the batch so that the live buffers peak there.
//
// Determinism: the checksum must not depend on anything but the parameters, on one GPU model,
// so that a run under the shim can be compared with a run without it. cuBLAS guarantees
// bitwise reproducible results for one architecture when every call uses one stream and the
// workspace is fixed (CUBLAS_WORKSPACE_CONFIG, set below before the handle exists); pedantic
// math mode keeps TF32 and reduced-precision reductions out; atomics are not allowed. The
// other reductions are the fixed-order kernels below. Data and weights come from a
// counter-based hash, the same on every run.
//
// Output and exit status follow train-mlp: `key: value` lines (loss per iteration, checksum
// = FNV-1a 64 of the final weights' bytes), 0 done, 1 a CUDA or cuBLAS call failed, 2 bad
// command line.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "size_arg.h"

namespace {

constexpr const char* kProgram = "train-cublas";
constexpr int kWidth = 256;          // inputs and every hidden layer
constexpr int kDefaultLayers = 4;
constexpr int kMaxLayers = 32;
constexpr int64_t kMinRows = 1024;
constexpr int64_t kChunkRows = 4096;  // loss partial sums: per chunk, then chunks in order
constexpr float kLearningRate = 0.005f;
constexpr unsigned kBlock = 256;

// ---------------------------------------------------------------------------------------------
// Errors

[[noreturn]] void failed(const char* call, const char* file, int line, const char* why) {
  std::fflush(stdout);
  std::fprintf(stderr, "%s: error: %s failed at %s:%d: %s\n", kProgram, call, file, line, why);
  std::exit(1);
}

void check(cudaError_t error, const char* call, const char* file, int line) {
  if (error != cudaSuccess) failed(call, file, line, cudaGetErrorString(error));
}

void check(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) failed(call, file, line, cublasGetStatusString(status));
}

#define CHECK(call) check((call), #call, __FILE__, __LINE__)

// ---------------------------------------------------------------------------------------------
// Kernels

// Uniform in [-1, 1) on a 2^-23 grid from a counter-based hash (splitmix64 of seed and index).
__host__ __device__ inline float hashed_uniform(uint64_t seed, uint64_t index) {
  uint64_t z = seed + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<int32_t>(z >> 40) - (1 << 23)) * 0x1p-23f;
}

__global__ void fill_uniform(float* out, int64_t count, uint64_t seed, float scale) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] = scale * hashed_uniform(seed, static_cast<uint64_t>(i));
}

__global__ void relu(float* x, int64_t count) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count && x[i] < 0.0f) x[i] = 0.0f;
}

// dx = dy where the layer's output a was positive, else 0 (the ReLU's gradient).
__global__ void relu_backward(const float* a, float* dy, int64_t count) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count && a[i] <= 0.0f) dy[i] = 0.0f;
}

// dp = (p - y) * scale, and each chunk's sum of squared errors in a fixed order.
__global__ void mse(const float* p, const float* y, float* dp, float* partials, int64_t rows,
                    float scale) {
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t begin = chunk * kChunkRows;
  if (begin >= rows) return;
  const int64_t end = begin + kChunkRows < rows ? begin + kChunkRows : rows;
  float sum = 0.0f;
  for (int64_t r = begin; r < end; ++r) {
    const float e = p[r] - y[r];
    dp[r] = e * scale;
    sum = __fadd_rn(sum, __fmul_rn(e, e));
  }
  partials[chunk] = sum;
}

__global__ void sum_partials(const float* partials, int64_t count, float scale, float* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  float sum = 0.0f;
  for (int64_t i = 0; i < count; ++i) sum = __fadd_rn(sum, partials[i]);
  *out = sum * scale;
}

unsigned blocks_for(int64_t count) { return static_cast<unsigned>((count + kBlock - 1) / kBlock); }

// ---------------------------------------------------------------------------------------------
// Device memory, counted as in train-mlp: the job's own measure of its live bytes and peak.

class DeviceHeap {
 public:
  float* allocate(int64_t count, const char* name) {
    void* p = nullptr;
    const size_t bytes = static_cast<size_t>(count) * sizeof(float);
    const cudaError_t error = cudaMalloc(&p, bytes);
    if (error != cudaSuccess) {
      failed(("cudaMalloc(" + std::string(name) + ", " + std::to_string(bytes) + " bytes)").c_str(),
             __FILE__, __LINE__, cudaGetErrorString(error));
    }
    live_ += bytes;
    peak_ = std::max(peak_, live_);
    sizes_.push_back({p, bytes});
    return static_cast<float*>(p);
  }
  void release(float*& p) {
    if (p == nullptr) return;
    CHECK(cudaFree(p));
    for (auto it = sizes_.begin(); it != sizes_.end(); ++it) {
      if (it->first != p) continue;
      live_ -= it->second;
      sizes_.erase(it);
      break;
    }
    p = nullptr;
  }
  uint64_t peak() const { return peak_; }

 private:
  std::vector<std::pair<void*, size_t>> sizes_;
  uint64_t live_ = 0;
  uint64_t peak_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Command line (the same flags and size syntax as train-mlp)

struct Options {
  uint64_t peak_bytes = 256ull << 20;
  int iters = 5;
  uint64_t seed = 1;
  int layers = kDefaultLayers;
};

[[noreturn]] void bad_argument(const std::string& message) {
  std::fprintf(stderr, "%s: bad argument: %s (try --help)\n", kProgram, message.c_str());
  std::exit(2);
}

using delta::workloads::parse_size;
using delta::workloads::parse_u64;

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf(
          "usage: %s [--peak SIZE] [--iters N] [--seed S] [--layers N]\n"
          "Trains a %d-wide ReLU network with cublasSgemm and prints, one `key: value` per line,\n"
          "the loss of every iteration and a checksum of the final weights.\n"
          "  --peak SIZE  device memory the job's live buffers peak at (default 256M; K/M/G/T)\n"
          "  --iters N    training iterations (default 5)\n"
          "  --seed S     seed of the weights and the data (default 1)\n"
          "  --layers N   hidden layers, 1 to %d (default %d)\n"
          "Exit status: 0 done, 1 a CUDA or cuBLAS call failed, 2 bad command line.\n",
          kProgram, kWidth, kMaxLayers, kDefaultLayers);
      std::exit(0);
    }
    const size_t eq = arg.find('=');
    const std::string_view name = arg.substr(0, eq);
    std::string_view value;
    if (eq != std::string_view::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      bad_argument(std::string(name) + " needs a value");
    }
    uint64_t number = 0;
    if (name == "--peak") {
      if (!parse_size(value, &options.peak_bytes)) bad_argument("--peak '" + std::string(value) + "' is not a size");
    } else if (name == "--iters") {
      if (!parse_u64(value, &number) || number < 1 || number > 100000) bad_argument("--iters '" + std::string(value) + "' is not a count from 1 to 100000");
      options.iters = static_cast<int>(number);
    } else if (name == "--seed") {
      if (!parse_u64(value, &options.seed)) bad_argument("--seed '" + std::string(value) + "' is not a number");
    } else if (name == "--layers") {
      if (!parse_u64(value, &number) || number < 1 || number > kMaxLayers) bad_argument("--layers '" + std::string(value) + "' is not a count from 1 to " + std::to_string(kMaxLayers));
      options.layers = static_cast<int>(number);
    } else {
      bad_argument("unknown option '" + std::string(name) + "'");
    }
  }
  return options;
}

// ---------------------------------------------------------------------------------------------
// Sizing

// The most bytes live at once, for `rows` rows: the weights and their gradients, the batch
// (x, y), every hidden layer's output (saved for backward), and, at the top of backward, the
// prediction, its gradient, the loss partials and two [rows, width] gradients.
uint64_t planned_peak_bytes(int64_t rows, int layers) {
  const uint64_t weights = (static_cast<uint64_t>(layers) * kWidth * kWidth + kWidth) * 2;
  const uint64_t chunks = static_cast<uint64_t>((rows + kChunkRows - 1) / kChunkRows);
  const uint64_t floats = weights + static_cast<uint64_t>(rows) * kWidth  // x
                          + static_cast<uint64_t>(rows)                    // y
                          + static_cast<uint64_t>(layers) * rows * kWidth  // saved outputs
                          + 2ull * rows + chunks + 1                       // p, dp, partials, loss
                          + 2ull * rows * kWidth;                          // two gradients
  return floats * sizeof(float);
}

int64_t rows_for_peak(uint64_t peak, int layers) {
  if (planned_peak_bytes(kMinRows, layers) > peak) return 0;
  int64_t low = kMinRows, high = kMinRows;
  while (planned_peak_bytes(high * 2, layers) <= peak && high < (int64_t{1} << 40)) high *= 2;
  high *= 2;
  while (high - low > 1) {
    const int64_t mid = low + (high - low) / 2;
    (planned_peak_bytes(mid, layers) <= peak ? low : high) = mid;
  }
  return low / 32 * 32;  // whole warps' worth of rows: the same kernels whatever the peak
}

constexpr uint64_t kFnvBasis = 0xCBF29CE484222325ull;

uint64_t fnv1a64(const void* data, size_t bytes, uint64_t hash) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 0x100000001B3ull;
  return hash;
}

// ---------------------------------------------------------------------------------------------
// Training. Matrices are row-major [rows][cols]; cuBLAS is column-major, so a row-major
// product C = A B is computed as the column-major C^T = B^T A^T.

// C[m][n] = A[m][k] B[k][n] (row-major), each optionally transposed as stored.
void gemm(cublasHandle_t handle, bool transA, bool transB, int64_t m, int64_t n, int64_t k,
          const float* a, const float* b, float* c) {
  const float one = 1.0f, zero = 0.0f;
  const int lda = static_cast<int>(transA ? m : k);
  const int ldb = static_cast<int>(transB ? k : n);
  CHECK(cublasSgemm(handle, transB ? CUBLAS_OP_T : CUBLAS_OP_N, transA ? CUBLAS_OP_T : CUBLAS_OP_N,
                    static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &one, b, ldb,
                    a, lda, &zero, c, static_cast<int>(n)));
}

int train(const Options& options) {
  const int layers = options.layers;
  const int64_t rows = rows_for_peak(options.peak_bytes, layers);
  if (rows == 0) {
    bad_argument("--peak " + std::to_string(options.peak_bytes) + " is below the smallest job, " +
                 std::to_string(planned_peak_bytes(kMinRows, layers)) + " bytes");
  }
  if (rows * kWidth > INT32_MAX) bad_argument("--peak is too large for 32-bit cuBLAS sizes");
  std::printf("workload: %s\n", kProgram);
  std::printf("peak_requested_bytes: %" PRIu64 "\n", options.peak_bytes);
  std::printf("planned_peak_bytes: %" PRIu64 "\n", planned_peak_bytes(rows, layers));
  std::printf("rows: %" PRId64 "\n", rows);
  std::printf("layers: %d x %d\n", layers, kWidth);
  std::printf("iters: %d\n", options.iters);
  std::printf("seed: %" PRIu64 "\n", options.seed);
  std::fflush(stdout);

  // Before the handle exists: a fixed workspace is part of cuBLAS's reproducibility promise.
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 1);
  CHECK(cudaSetDevice(0));
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t handle = nullptr;
  CHECK(cublasCreate(&handle));
  CHECK(cublasSetStream(handle, stream));
  CHECK(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH));
  CHECK(cublasSetAtomicsMode(handle, CUBLAS_ATOMICS_NOT_ALLOWED));

  DeviceHeap heap;
  // Weights: w[l] is [width][width] for the hidden layers, w[layers] is [width][1]; scaled so
  // that activations stay of order one.
  std::vector<float*> w(layers + 1), dw(layers + 1);
  std::vector<int64_t> w_count(layers + 1);
  for (int l = 0; l <= layers; ++l) {
    w_count[l] = int64_t{kWidth} * (l == layers ? 1 : kWidth);
    w[l] = heap.allocate(w_count[l], "weights");
    dw[l] = heap.allocate(w_count[l], "weight gradients");
    fill_uniform<<<blocks_for(w_count[l]), kBlock, 0, stream>>>(
        w[l], w_count[l], options.seed * 1000003 + l, 1.7f / 16.0f);
  }
  float* teacher = heap.allocate(kWidth, "teacher");
  fill_uniform<<<blocks_for(kWidth), kBlock, 0, stream>>>(teacher, kWidth, 0x7eac4e7, 0.25f);
  float* loss = heap.allocate(1, "loss");
  CHECK(cudaGetLastError());
  const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;

  const auto start = std::chrono::steady_clock::now();
  std::vector<float*> a(layers, nullptr);
  for (int it = 0; it < options.iters; ++it) {
    // The batch and its targets (y = x . teacher).
    float* x = heap.allocate(rows * kWidth, "x");
    fill_uniform<<<blocks_for(rows * kWidth), kBlock, 0, stream>>>(
        x, rows * kWidth, (options.seed << 20) + static_cast<uint64_t>(it), 1.0f);
    float* y = heap.allocate(rows, "y");
    gemm(handle, false, false, rows, 1, kWidth, x, teacher, y);

    // Forward: a[l] = relu(input w[l]), saved for backward.
    const float* input = x;
    for (int l = 0; l < layers; ++l) {
      a[l] = heap.allocate(rows * kWidth, "activation");
      gemm(handle, false, false, rows, kWidth, kWidth, input, w[l], a[l]);
      relu<<<blocks_for(rows * kWidth), kBlock, 0, stream>>>(a[l], rows * kWidth);
      input = a[l];
    }
    float* p = heap.allocate(rows, "prediction");
    gemm(handle, false, false, rows, 1, kWidth, input, w[layers], p);

    float* dp = heap.allocate(rows, "prediction gradient");
    float* partials = heap.allocate(chunks, "loss partials");
    mse<<<blocks_for(chunks), kBlock, 0, stream>>>(p, y, dp, partials, rows,
                                                   2.0f / static_cast<float>(rows));
    sum_partials<<<1, 1, 0, stream>>>(partials, chunks, 1.0f / static_cast<float>(rows), loss);
    heap.release(p);
    heap.release(y);
    heap.release(partials);

    // Backward: dw[l] = input^T dy, dx = dy w[l]^T through the ReLU.
    gemm(handle, true, false, kWidth, 1, rows, input, dp, dw[layers]);
    float* dy = heap.allocate(rows * kWidth, "gradient");
    gemm(handle, false, true, rows, kWidth, 1, dp, w[layers], dy);
    heap.release(dp);
    for (int l = layers - 1; l >= 0; --l) {
      relu_backward<<<blocks_for(rows * kWidth), kBlock, 0, stream>>>(a[l], dy, rows * kWidth);
      const float* layer_input = l == 0 ? x : a[l - 1];
      gemm(handle, true, false, kWidth, kWidth, rows, layer_input, dy, dw[l]);
      if (l > 0) {
        float* dx = heap.allocate(rows * kWidth, "gradient");
        gemm(handle, false, true, rows, kWidth, kWidth, dy, w[l], dx);
        heap.release(dy);
        dy = dx;
      }
      heap.release(a[l]);
    }
    heap.release(dy);
    heap.release(x);

    // SGD: w -= lr * dw.
    const float step = -kLearningRate;
    for (int l = 0; l <= layers; ++l)
      CHECK(cublasSaxpy(handle, static_cast<int>(w_count[l]), &step, dw[l], 1, w[l], 1));

    float host_loss = 0.0f;
    CHECK(cudaMemcpyAsync(&host_loss, loss, sizeof host_loss, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    std::printf("loss: %.9g\n", static_cast<double>(host_loss));
  }
  CHECK(cudaStreamSynchronize(stream));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  uint64_t checksum = kFnvBasis;
  for (int l = 0; l <= layers; ++l) {
    std::vector<float> host(static_cast<size_t>(w_count[l]));
    CHECK(cudaMemcpy(host.data(), w[l], host.size() * sizeof(float), cudaMemcpyDeviceToHost));
    checksum = fnv1a64(host.data(), host.size() * sizeof(float), checksum);
  }
  std::printf("peak_live_bytes: %" PRIu64 "\n", heap.peak());
  std::printf("seconds: %.3f\n", seconds);
  std::printf("checksum: 0x%016" PRIx64 "\n", checksum);

  for (int l = 0; l <= layers; ++l) {
    heap.release(w[l]);
    heap.release(dw[l]);
  }
  heap.release(teacher);
  heap.release(loss);
  CHECK(cublasDestroy(handle));
  CHECK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return train(parse_options(argc, argv)); }
