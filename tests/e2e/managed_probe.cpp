// managed-probe: allocates the way programs do (cudaMalloc, large and small, and the driver's
// cuMemAlloc) and reports, one `key: value` per line, what memory it got, as the driver
// describes it: whether it is managed memory, its preferred location and the last place it
// was prefetched to (a device ordinal, -1 for the host, -2 for none). Under DELTA_MODE=uvm the
// large allocations must be managed, prefer device 0 and have been prefetched there; without
// the shim, or in the default mode, none is managed. Also prints what cudaMemGetInfo and
// cuMemGetInfo report, and checks that data survives a round trip through every buffer.
// Uses only the real CUDA API. Exit status 0 when every call worked, 1 otherwise.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr size_t kLarge = 4 << 20;
constexpr size_t kSmall = 64 << 10;

[[noreturn]] void fail(const char* call, int code) {
  std::fflush(stdout);
  std::fprintf(stderr, "managed-probe: %s failed (%d)\n", call, code);
  std::exit(1);
}

#define RT(call)                                       \
  do {                                                 \
    if (cudaError_t e_ = (call); e_ != cudaSuccess) fail(#call, e_); \
  } while (0)
#define CU(call)                                       \
  do {                                                 \
    if (CUresult r_ = (call); r_ != CUDA_SUCCESS) fail(#call, r_); \
  } while (0)

void describe(const char* name, CUdeviceptr p, size_t bytes) {
  unsigned int managed = 0;
  CU(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p));
  std::printf("%s_managed: %u\n", name, managed & 0xff);
  if ((managed & 0xff) == 0) return;
  int preferred = 0, prefetched = 0;
  CU(cuMemRangeGetAttribute(&preferred, sizeof preferred, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION,
                            p, bytes));
  CU(cuMemRangeGetAttribute(&prefetched, sizeof prefetched,
                            CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, p, bytes));
  std::printf("%s_preferred_location: %d\n", name, preferred);
  std::printf("%s_last_prefetch_location: %d\n", name, prefetched);
}

bool roundTrip(CUdeviceptr p, size_t bytes, unsigned char value) {
  RT(cudaMemset(reinterpret_cast<void*>(p), value, bytes));
  std::vector<unsigned char> back(bytes, 0);
  RT(cudaMemcpy(back.data(), reinterpret_cast<void*>(p), bytes, cudaMemcpyDeviceToHost));
  for (unsigned char b : back)
    if (b != value) return false;
  return true;
}

}  // namespace

int main() {
  RT(cudaSetDevice(0));
  void* large = nullptr;
  void* small = nullptr;
  RT(cudaMalloc(&large, kLarge));
  RT(cudaMalloc(&small, kSmall));
  CUdeviceptr driverLarge = 0;
  CU(cuMemAlloc(&driverLarge, kLarge));

  describe("runtime_large", reinterpret_cast<CUdeviceptr>(large), kLarge);
  describe("runtime_small", reinterpret_cast<CUdeviceptr>(small), kSmall);
  describe("driver_large", driverLarge, kLarge);

  const bool ok = roundTrip(reinterpret_cast<CUdeviceptr>(large), kLarge, 0x3c) &&
                  roundTrip(reinterpret_cast<CUdeviceptr>(small), kSmall, 0x5a) &&
                  roundTrip(driverLarge, kLarge, 0x7e);
  std::printf("round_trip: %s\n", ok ? "ok" : "wrong");

  size_t free = 0, total = 0;
  RT(cudaMemGetInfo(&free, &total));
  std::printf("runtime_total_bytes: %zu\n", total);
  std::printf("runtime_free_bytes: %zu\n", free);
  CU(cuMemGetInfo(&free, &total));
  std::printf("driver_total_bytes: %zu\n", total);

  RT(cudaFree(large));
  RT(cudaFree(small));
  CU(cuMemFree(driverLarge));
  return ok ? 0 : 1;
}
