// train-segments: a training job that keeps its activations the way PyTorch's caching allocator
// does with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, for the shim's end-to-end tests of
// a framework's own virtual memory (tests/e2e/segments_e2e_test.cpp). Runs on cudasim.
//
// - One large address range is reserved (cuMemAddressReserve) and physical memory is created
//   (cuMemCreate, exportable as a POSIX file descriptor, as PyTorch asks) and mapped into it
//   (cuMemMap, cuMemSetAccess) one --chunk at a time as the activations of a step need it;
//   activations are laid out back to back, so one may straddle two chunks.
// - Every --empty-every steps the job "empties the cache": it synchronises, unmaps every chunk
//   and releases it (cuMemUnmap, cuMemRelease), and the next step maps new ones.
// - The weights, their gradients and momenta are ordinary cudaMalloc buffers (2 MiB each), or,
//   with --params-in-segment 1, blocks of a second segment mapped once at the start and kept, as
//   PyTorch keeps every tensor in its segments.
// - With --declare 1 the job tells the shim where each of its blocks ends, as a framework hook
//   would (delta_declare_extent, looked up at run time: without the shim, nothing happens).
//
// The model: --layers element-wise layers out = softsign(in * w + b), an L2 loss against a
// target that changes every step, SGD with momentum. Output, one `key: value` per line:
// `peak_bytes` (cudaMalloc buffers plus the most physical memory mapped at once),
// `segment_peak_bytes`, `loss_<step>` (hexadecimal float), `checksum` (FNV-1a 64 of the final
// weights and momenta). They depend only on the arguments.
// Exit status: 0 done, 1 a CUDA call failed (named on stderr), 2 bad arguments.
#include <cuda.h>
#include <dlfcn.h>
#include <cuda_runtime_api.h>
#include <cudasim/cudasim.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "sim_workload.h"
#include "size_arg.h"

namespace {

constexpr const char* kProgram = "train-segments";
using delta::workloads::arg;
using delta::workloads::hashedUnit;

// Driver calls (the segment's virtual memory): the same, with the driver's error number.
#define CHECK_CU(call)                                                              \
  do {                                                                              \
    CUresult r_ = (call);                                                           \
    if (r_ != CUDA_SUCCESS) {                                                       \
      std::fprintf(stderr, "%s: %s failed (line %d): CUresult %d\n", kProgram, #call, \
                   __LINE__, static_cast<int>(r_));                                 \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

void init_kernel() {}
void forward_kernel() {}
void loss_kernel() {}
void backward_kernel() {}
void sgd_kernel() {}

// (buffer, n, seed, scale)
void init_body(void** p, dim3, dim3) {
  float* b = arg<float*>(p, 0);
  const uint64_t n = arg<uint64_t>(p, 1), seed = arg<uint64_t>(p, 2);
  const float scale = arg<float>(p, 3);
  for (uint64_t i = 0; i < n; ++i) {
    b[i] = scale * (hashedUnit(seed, i) - 0.5f);
  }
}

// (in, w, out, n): out = softsign(in * w + 0.1)
void forward_body(void** p, dim3, dim3) {
  const float* in = arg<const float*>(p, 0);
  const float* w = arg<const float*>(p, 1);
  float* out = arg<float*>(p, 2);
  const uint64_t n = arg<uint64_t>(p, 3);
  for (uint64_t i = 0; i < n; ++i) {
    const float z = in[i] * w[i] + 0.1f;
    out[i] = z / (1.0f + std::fabs(z));
  }
}

// (out, d, loss, n, step): d = 2 (out - target) / n; loss[0] = mean square
void loss_body(void** p, dim3, dim3) {
  const float* out = arg<const float*>(p, 0);
  float* d = arg<float*>(p, 1);
  float* loss = arg<float*>(p, 2);
  const uint64_t n = arg<uint64_t>(p, 3), step = arg<uint64_t>(p, 4);
  float sum = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const float target = 0.25f * static_cast<float>((i * 7 + step * 13) % 5) - 0.5f;
    const float diff = out[i] - target;
    sum += diff * diff;
    d[i] = 2.0f * diff / static_cast<float>(n);
  }
  loss[0] = sum / static_cast<float>(n);
}

// (in, out, w, d, g, n): through softsign, d (in place) becomes the input's gradient.
void backward_body(void** p, dim3, dim3) {
  const float* in = arg<const float*>(p, 0);
  const float* out = arg<const float*>(p, 1);
  const float* w = arg<const float*>(p, 2);
  float* d = arg<float*>(p, 3);
  float* g = arg<float*>(p, 4);
  const uint64_t n = arg<uint64_t>(p, 5);
  for (uint64_t i = 0; i < n; ++i) {
    const float slope = (1.0f - std::fabs(out[i])) * (1.0f - std::fabs(out[i]));
    const float dz = d[i] * slope;
    g[i] = dz * in[i];
    d[i] = dz * w[i];
  }
}

// (w, m, g, n): in place
void sgd_body(void** p, dim3, dim3) {
  float* w = arg<float*>(p, 0);
  float* m = arg<float*>(p, 1);
  const float* g = arg<const float*>(p, 2);
  const uint64_t n = arg<uint64_t>(p, 3);
  for (uint64_t i = 0; i < n; ++i) {
    m[i] = 0.9f * m[i] + g[i];
    w[i] -= 0.05f * m[i];
  }
}

void register_kernels() {
  static const size_t init[] = {8, 8, 8, 4};
  static const size_t forward[] = {8, 8, 8, 8};
  static const size_t loss[] = {8, 8, 8, 8, 8};
  static const size_t backward[] = {8, 8, 8, 8, 8, 8};
  static const size_t sgd[] = {8, 8, 8, 8};
  auto key = [](void (*f)()) { return reinterpret_cast<const void*>(f); };
  cudasimRegisterKernel(key(init_kernel), "segments_init", init_body, 4, init);
  cudasimRegisterKernel(key(forward_kernel), "segments_fwd", forward_body, 4, forward);
  cudasimRegisterKernel(key(loss_kernel), "segments_loss", loss_body, 5, loss);
  cudasimRegisterKernel(key(backward_kernel), "segments_bwd", backward_body, 6, backward);
  cudasimRegisterKernel(key(sgd_kernel), "segments_sgd", sgd_body, 4, sgd);
}

void launch(void (*kernel)(), void** args, cudaStream_t stream) {
  CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), dim3(1), dim3(1), args, 0, stream));
}

struct Options {
  int layers = 8;
  int steps = 6;
  uint64_t seed = 1;
  uint64_t activation = 512 << 10;  // bytes per activation in the segment
  uint64_t chunk = 2 << 20;         // what one cuMemCreate/cuMemMap adds to the segment
  int emptyEvery = 3;
  bool paramsInSegment = false;
  bool declare = false;
};

// delta_declare_extent of the shim's public API, when the shim is there.
using DeclareExtent = int (*)(const void*, size_t);
DeclareExtent gDeclare = nullptr;
void declare(const void* block, uint64_t bytes) {
  if (gDeclare != nullptr && gDeclare(block, bytes) != 0) {
    std::fprintf(stderr, "%s: delta_declare_extent refused the block at %p\n", kProgram, block);
    std::exit(1);
  }
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "train-segments: %s\nusage: train-segments [--layers N] [--steps N] [--seed N] "
               "[--activation SIZE] [--chunk SIZE] [--empty-every N] [--params-in-segment 0|1] "
               "[--declare 0|1]\n",
               why.c_str());
  std::exit(2);
}

// The expandable segment: a reserved range, mapped from the start one chunk at a time.
class Segment {
 public:
  explicit Segment(uint64_t chunk) : chunk_(chunk) {
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = 0;
    prop_.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CHECK_CU(cuMemAddressReserve(&base_, kReserved, 0, 0, 0));
  }
  ~Segment() {
    empty();
    cuMemAddressFree(base_, kReserved);
  }
  // Maps chunks until the first `bytes` of the segment are backed.
  void grow(uint64_t bytes) {
    if (bytes > kReserved) usage("the activations do not fit the reserved range");
    while (handles_.size() * chunk_ < bytes) {
      CUmemGenericAllocationHandle handle = 0;
      CHECK_CU(cuMemCreate(&handle, chunk_, &prop_, 0));
      const CUdeviceptr at = base_ + handles_.size() * chunk_;
      CHECK_CU(cuMemMap(at, chunk_, 0, handle, 0));
      CUmemAccessDesc access{};
      access.location = prop_.location;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      CHECK_CU(cuMemSetAccess(at, chunk_, &access, 1));
      handles_.push_back(handle);
    }
    peak_ = std::max<uint64_t>(peak_, handles_.size() * chunk_);
  }
  // PyTorch's empty_cache: nothing in the segment is in use any more.
  void empty() {
    if (handles_.empty()) return;
    CHECK(cudaDeviceSynchronize());
    for (size_t i = 0; i < handles_.size(); ++i) {
      CHECK_CU(cuMemUnmap(base_ + i * chunk_, chunk_));
      CHECK_CU(cuMemRelease(handles_[i]));
    }
    handles_.clear();
  }
  float* at(uint64_t offset) const { return reinterpret_cast<float*>(base_ + offset); }
  uint64_t peak() const { return peak_; }

 private:
  static constexpr uint64_t kReserved = 1ull << 30;
  const uint64_t chunk_;
  CUmemAllocationProp prop_{};
  CUdeviceptr base_ = 0;
  std::vector<CUmemGenericAllocationHandle> handles_;
  uint64_t peak_ = 0;
};

float* device_floats(uint64_t bytes) {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, bytes));
  return static_cast<float*>(p);
}

void run(const Options& o) {
  constexpr uint64_t kParameterBytes = 2 << 20;
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreate(&stream));
  const int L = o.layers;
  std::vector<float*> weights(L), grads(L), momenta(L);
  Segment parameters(o.chunk);
  if (o.paramsInSegment) parameters.grow(3 * L * kParameterBytes);
  auto parameter = [&](int slot) {
    if (!o.paramsInSegment) return device_floats(kParameterBytes);
    float* block = parameters.at(static_cast<uint64_t>(slot) * kParameterBytes);
    if (o.declare) declare(block, kParameterBytes);
    return block;
  };
  for (int i = 0; i < L; ++i) {
    weights[i] = parameter(i);
    grads[i] = parameter(L + i);
    momenta[i] = parameter(2 * L + i);
    uint64_t n = kParameterBytes / 4, seed = o.seed * 1000 + i;
    float scale = 2.0f;
    void* args[] = {&weights[i], &n, &seed, &scale};
    launch(init_kernel, args, stream);
    CHECK(cudaMemsetAsync(momenta[i], 0, kParameterBytes, stream));
  }
  Segment segment(o.chunk);
  uint64_t n = o.activation / 4;
  for (int step = 0; step < o.steps; ++step) {
    // Activations 0..L, then the gradient and the loss, back to back: the segment grows as the
    // forward pass goes.
    auto activation = [&](int i) { return segment.at(static_cast<uint64_t>(i) * o.activation); };
    segment.grow(o.activation);
    if (o.declare) declare(activation(0), o.activation);
    float* input = activation(0);
    uint64_t seed = o.seed * 7919 + step;
    float scale = 4.0f;
    void* initArgs[] = {&input, &n, &seed, &scale};
    launch(init_kernel, initArgs, stream);
    for (int i = 0; i < L; ++i) {
      segment.grow(static_cast<uint64_t>(i + 2) * o.activation);
      if (o.declare) declare(activation(i + 1), o.activation);
      float* in = activation(i);
      float* out = activation(i + 1);
      void* args[] = {&in, &weights[i], &out, &n};
      launch(forward_kernel, args, stream);
    }
    const uint64_t tail = static_cast<uint64_t>(L + 1) * o.activation;
    segment.grow(tail + o.activation + 4096);
    float* d = segment.at(tail);
    float* loss = segment.at(tail + o.activation);
    if (o.declare) {
      declare(d, o.activation);
      declare(loss, 4096);
    }
    float* last = activation(L);
    uint64_t stepArg = static_cast<uint64_t>(step);
    void* lossArgs[] = {&last, &d, &loss, &n, &stepArg};
    launch(loss_kernel, lossArgs, stream);
    for (int i = L - 1; i >= 0; --i) {
      float* in = activation(i);
      float* out = activation(i + 1);
      void* args[] = {&in, &out, &weights[i], &d, &grads[i], &n};
      launch(backward_kernel, args, stream);
    }
    for (int i = 0; i < L; ++i) {
      void* args[] = {&weights[i], &momenta[i], &grads[i], &n};
      launch(sgd_kernel, args, stream);
    }
    float value = 0;
    CHECK(cudaMemcpyAsync(&value, loss, sizeof value, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    std::printf("loss_%d: %a\n", step, static_cast<double>(value));
    if ((step + 1) % o.emptyEvery == 0) segment.empty();
  }
  CHECK(cudaStreamSynchronize(stream));
  uint64_t checksum = 0xcbf29ce484222325ull;
  std::vector<unsigned char> host(kParameterBytes);
  for (int i = 0; i < L; ++i) {
    for (float* buffer : {weights[i], momenta[i]}) {
      CHECK(cudaMemcpy(host.data(), buffer, kParameterBytes, cudaMemcpyDeviceToHost));
      for (unsigned char byte : host) checksum = (checksum ^ byte) * 0x100000001b3ull;
    }
    if (!o.paramsInSegment) {
      CHECK(cudaFree(weights[i]));
      CHECK(cudaFree(grads[i]));
      CHECK(cudaFree(momenta[i]));
    }
  }
  std::printf("segment_peak_bytes: %" PRIu64 "\n", segment.peak() + parameters.peak());
  std::printf("peak_bytes: %" PRIu64 "\n",
              (o.paramsInSegment ? 0 : 3 * L * kParameterBytes) + parameters.peak() + segment.peak());
  std::printf("checksum: %016" PRIx64 "\n", checksum);
  CHECK(cudaStreamDestroy(stream));
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
    uint64_t v = 0;
    const bool size = name == "--activation" || name == "--chunk";
    const bool flag = name == "--params-in-segment" || name == "--declare";
    if (flag && value != "0" && value != "1") usage(name + " takes 0 or 1, not " + value);
    if (!(size ? parse_size(value, &v) : parse_u64(value, &v)))
      usage("bad value for " + name + ": " + value);
    if (name == "--layers") o.layers = static_cast<int>(v);
    else if (name == "--steps") o.steps = static_cast<int>(v);
    else if (name == "--seed") o.seed = v;
    else if (name == "--activation") o.activation = v;
    else if (name == "--chunk") o.chunk = v;
    else if (name == "--empty-every") o.emptyEvery = static_cast<int>(v);
    else if (name == "--params-in-segment") o.paramsInSegment = v == 1;
    else if (name == "--declare") o.declare = v == 1;
    else usage("unknown option " + name);
  }
  if (o.layers < 1 || o.layers > 64) usage("--layers must be 1 to 64");
  if (o.steps < 1 || o.emptyEvery < 1) usage("--steps and --empty-every must be positive");
  if (o.activation < 4096 || o.activation % 4096 != 0 || o.activation > (2u << 20))
    usage("--activation must be a multiple of 4 KiB, at most 2 MiB");
  if (o.chunk < (2u << 20) || o.chunk % (2u << 20) != 0)
    usage("--chunk must be a multiple of 2 MiB (the allocation granularity)");
  register_kernels();
  if (o.declare) gDeclare = reinterpret_cast<DeclareExtent>(dlsym(RTLD_DEFAULT, "delta_declare_extent"));
  run(o);
  return 0;
}
