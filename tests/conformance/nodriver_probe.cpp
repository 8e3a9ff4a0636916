/* Probe for the "no driver" conformance test: loads the libcudart.so.13 given as argv[1]
 * (a copy placed where no libcuda.so.1 is) with dlopen, links no CUDA library itself, and
 * checks that runtime calls return cudaErrorInsufficientDriver (35). Exit 0 on success. */
#include <dlfcn.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s /path/to/libcudart.so.13\n", argv[0]);
    return 2;
  }
  void* rt = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (rt == nullptr) {
    std::fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
    return 2;
  }
  if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD) != nullptr) {
    std::fprintf(stderr, "a libcuda.so.1 is loaded anyway: the test cannot run\n");
    return 3;
  }
  using CountFn = int (*)(int*);
  using MallocFn = int (*)(void**, size_t);
  auto count = reinterpret_cast<CountFn>(dlsym(rt, "cudaGetDeviceCount"));
  auto malloc_fn = reinterpret_cast<MallocFn>(dlsym(rt, "cudaMalloc"));
  if (count == nullptr || malloc_fn == nullptr) {
    std::fprintf(stderr, "runtime symbols missing\n");
    return 2;
  }
  int n = -1;
  int rc = 0;
  if (int e = count(&n); e != 35) {
    std::fprintf(stderr, "cudaGetDeviceCount returned %d, expected 35\n", e);
    rc = 1;
  }
  void* p = nullptr;
  if (int e = malloc_fn(&p, 16); e != 35) {
    std::fprintf(stderr, "cudaMalloc returned %d, expected 35\n", e);
    rc = 1;
  }
  return rc;
}
