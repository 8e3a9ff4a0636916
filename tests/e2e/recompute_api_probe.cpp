// recompute-api-probe: walks the recompute API of delta/delta.h through its edge cases, under
// DELTA_POLICY=recompute-only and a 4 MiB budget (set by the test), so that exactly the two
// registered buffers are dropped when two unregistered ones are allocated. Prints `key: value`
// lines the test checks; exit 0 when it got to the end, 1 when a CUDA call failed unexpectedly.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cudasim/cudasim.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "delta/delta.h"

namespace {

constexpr size_t kBytes = 2u << 20;  // one 2 MiB granule each
constexpr size_t kCount = kBytes / sizeof(float);

void fill(float*, float, uint64_t) {}
void fill_body(void** p, dim3, dim3) {
  float* out = *static_cast<float**>(p[0]);
  const float value = *static_cast<float*>(p[1]);
  const uint64_t n = *static_cast<uint64_t*>(p[2]);
  for (uint64_t i = 0; i < n; ++i) out[i] = value + static_cast<float>(i % 13);
}

__attribute__((constructor)) void register_kernels() {
  static const size_t sizes[] = {sizeof(float*), sizeof(float), sizeof(uint64_t)};
  cudasimRegisterKernel(reinterpret_cast<const void*>(fill), "fill", fill_body, 3, sizes);
}

cudaError_t launch_fill(float* out, float value, cudaStream_t stream) {
  uint64_t n = kCount;
  void* args[] = {&out, &value, &n};
  return cudaLaunchKernel(reinterpret_cast<const void*>(fill), dim3(1), dim3(1), args, 0, stream);
}

void check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return;
  std::fprintf(stderr, "recompute-api-probe: %s: %s\n", what, cudaGetErrorString(error));
  std::exit(1);
}

// Whether the buffer holds what fill(value) wrote.
bool holds(const float* device, float value) {
  std::vector<float> host(kCount);
  check(cudaMemcpy(host.data(), device, kBytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  for (size_t i = 0; i < kCount; ++i)
    if (host[i] != value + static_cast<float>(i % 13)) return false;
  return true;
}

int gCallbacks = 0;
int regenerate(void* ctx, void* ptr, size_t bytes, void* stream) {
  ++gCallbacks;
  if (bytes != kBytes) return -1;
  return launch_fill(static_cast<float*>(ptr), *static_cast<float*>(ctx),
                     static_cast<cudaStream_t>(stream)) == cudaSuccess ? 0 : -1;
}

int gNotices = 0;
void notice(void*, void*, size_t) { ++gNotices; }

template <class F>
F find(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

float* device_buffer() {
  void* pointer = nullptr;
  check(cudaMalloc(&pointer, kBytes), "cudaMalloc");
  return static_cast<float*>(pointer);
}

}  // namespace

int main() {
  auto api_version = find<decltype(&delta_api_version)>("delta_api_version");
  if (api_version == nullptr) {
    std::printf("shim: absent\n");
    return 0;
  }
  auto register_recompute = find<decltype(&delta_register_recompute)>("delta_register_recompute");
  auto register_framework = find<decltype(&delta_register_framework_managed)>("delta_register_framework_managed");
  auto unregister = find<decltype(&delta_unregister)>("delta_unregister");
  auto is_dropped = find<decltype(&delta_is_dropped)>("delta_is_dropped");
  auto begin_recompute = find<decltype(&delta_begin_recompute)>("delta_begin_recompute");
  auto recomputed = find<decltype(&delta_recomputed)>("delta_recomputed");
  auto set_notifier = find<decltype(&delta_set_drop_notifier)>("delta_set_drop_notifier");
  std::printf("api_version: %d\n", api_version());

  // Before anything is allocated the shim is not active: registrations answer -1.
  int on_stack = 0;
  std::printf("register_before_active: %d\n", register_recompute(&on_stack, 1, regenerate, nullptr));
  std::printf("notifier_before_active: %d\n", set_notifier(notice, nullptr));

  float value_a = 1.0f, value_b = 2.0f;
  float* a = device_buffer();
  float* b = device_buffer();
  check(launch_fill(a, value_a, nullptr), "fill a");
  check(launch_fill(b, value_b, nullptr), "fill b");
  std::printf("register_callback: %d\n", register_recompute(a, 1000, regenerate, &value_a));
  std::printf("register_framework: %d\n", register_framework(b, 1000));
  std::printf("register_host_pointer: %d\n", register_framework(&on_stack, 1000));
  std::printf("dropped_host_pointer: %d\n", is_dropped(&on_stack));
  std::printf("register_interior_pointer: %d\n", register_recompute(a + 100, 1000, regenerate, &value_a));
  std::printf("register_null_callback: %d\n", register_recompute(a, 1000, nullptr, nullptr));

  // Two unregistered buffers, written: under recompute-only, a and b are the only victims.
  float* c = device_buffer();
  check(launch_fill(c, 3.0f, nullptr), "fill c");
  float* d = device_buffer();
  check(launch_fill(d, 4.0f, nullptr), "fill d");
  check(cudaDeviceSynchronize(), "sync");
  std::printf("a_dropped: %d\nb_dropped: %d\n", is_dropped(a), is_dropped(b));
  std::printf("drop_notices: %d\n", gNotices);

  // A copy out of a dropped callback buffer (seen through CUPTI) regenerates it first.
  std::printf("a_after_copy: %s\n", holds(a, value_a) ? "intact" : "WRONG");
  std::printf("callbacks: %d\n", gCallbacks);

  // A launch that touches the dropped framework-managed buffer fails; nothing ran on it.
  cudaError_t misuse = launch_fill(b, 9.0f, nullptr);
  std::printf("misuse: %s\n", cudaGetErrorName(misuse));
  std::printf("b_still_dropped: %d\n", is_dropped(b));

  // The framework's way: begin (memory back), regenerate, recomputed.
  std::printf("begin_b: %d\n", begin_recompute(b));
  check(launch_fill(b, value_b, nullptr), "regenerate b");
  std::printf("recomputed_b: %d\n", recomputed(b));
  std::printf("b_after_regeneration: %s\n", holds(b, value_b) ? "intact" : "WRONG");
  std::printf("begin_resident_b: %d\n", begin_recompute(b));

  // Drop a again (c and d used again), then unregister it: the callback regenerates it first.
  check(launch_fill(c, 3.0f, nullptr), "fill c");
  check(launch_fill(d, 4.0f, nullptr), "fill d");
  check(cudaDeviceSynchronize(), "sync");
  const int dropped_again = is_dropped(a);
  const int callbacks_before = gCallbacks;
  std::printf("a_dropped_again: %d\n", dropped_again);
  std::printf("unregister_a: %d\n", unregister(a));
  std::printf("unregister_regenerated: %d\n", gCallbacks - callbacks_before);
  std::printf("a_after_unregister: %s\n", holds(a, value_a) ? "intact" : "WRONG");
  std::printf("unregister_host_pointer: %d\n", unregister(&on_stack));

  for (float* p : {a, b, c, d}) check(cudaFree(p), "cudaFree");

  // PyTorch's CUDAPluggableAllocator entry points: each tensor a managed buffer of its own.
  auto torch_malloc = find<decltype(&delta_torch_malloc)>("delta_torch_malloc");
  auto torch_free = find<decltype(&delta_torch_free)>("delta_torch_free");
  auto get_stats = find<decltype(&delta_get_stats)>("delta_get_stats");
  delta_stats before{}, during{}, after{};
  get_stats(&before, sizeof before);
  void* tensor = torch_malloc(3 << 20, 0, nullptr);
  get_stats(&during, sizeof during);
  torch_free(tensor, 3 << 20, 0, nullptr);
  get_stats(&after, sizeof after);
  std::printf("torch_malloc: %s\n", tensor != nullptr ? "ok" : "NULL");
  std::printf("torch_malloc_managed: %d\n", static_cast<int>(during.live_buffers - before.live_buffers));
  std::printf("torch_free_released: %d\n", static_cast<int>(during.live_buffers - after.live_buffers));
  std::printf("torch_malloc_zero: %s\n", torch_malloc(0, 0, nullptr) == nullptr ? "NULL" : "not NULL");
  std::printf("torch_malloc_too_big: %s\n",
              torch_malloc(ptrdiff_t(1) << 50, 0, nullptr) == nullptr ? "NULL" : "not NULL");
  std::printf("done: yes\n");
  return 0;
}
