// vmm-probe: the program's own virtual memory (cuMemCreate, cuMemMap into its own reservation),
// one way of using it per run, each checked for what kernels read, for
// tests/e2e/segments_e2e_test.cpp. Under libdelta.so with DELTA_BUDGET=12M, pressure() fills the
// whole budget with three cudaMalloc buffers, so every mapping of the program's is evicted
// before the calls under test: its contents must come back bit-exact wherever the program
// reaches them, and its handle calls must answer as the driver does. Runs without the shim too.
//
// usage: vmm-probe SCENARIO    (vmm-probe list: the scenarios, one per line)
// Prints `SCENARIO: ok` and, under the shim, `evictions: N` (what the pressures evicted).
// Exit status 0 ok, 1 a check or a CUDA call failed, 2 usage.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cudasim/cudasim.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "shim/include/delta/delta.h"

namespace {

constexpr uint64_t kChunk = 2 << 20;  // the allocation granularity: one cuMemCreate each
constexpr uint64_t kFiller = 4 << 20;
constexpr int kFillers = 3;  // as much as the budget the test gives

[[noreturn]] void fail(const std::string& what) {
  std::fflush(stdout);
  std::fprintf(stderr, "vmm-probe: %s\n", what.c_str());
  std::exit(1);
}
#define CHECK(call)                                                                     \
  do {                                                                                  \
    if (cudaError_t e_ = (call); e_ != cudaSuccess)                                     \
      fail(std::string(#call) + " failed: " + cudaGetErrorString(e_));                  \
  } while (0)
#define CHECK_CU(call)                                                                  \
  do {                                                                                  \
    if (CUresult r_ = (call); r_ != CUDA_SUCCESS)                                       \
      fail(std::string(#call) + " failed: CUresult " + std::to_string(static_cast<int>(r_))); \
  } while (0)
#define EXPECT(condition)                                                               \
  do {                                                                                  \
    if (!(condition)) fail(std::string("check failed: ") + #condition);                 \
  } while (0)

template <typename T>
T arg(void** params, int i) {
  return *static_cast<T*>(params[i]);
}

uint64_t word(uint64_t seed, uint64_t i) { return seed * 0x9E3779B97F4A7C15ull + i * 0x100000001b3ull; }
uint64_t expectedSum(uint64_t seed, uint64_t words) {
  uint64_t sum = 0;
  for (uint64_t i = 0; i < words; ++i) sum += word(seed, i);
  return sum;
}

void fill_kernel() {}
void sum_kernel() {}

// (buffer, words, seed)
void fill_body(void** p, dim3, dim3) {
  uint64_t* buffer = arg<uint64_t*>(p, 0);
  const uint64_t words = arg<uint64_t>(p, 1), seed = arg<uint64_t>(p, 2);
  for (uint64_t i = 0; i < words; ++i) buffer[i] = word(seed, i);
}
// (buffer, words, out): out[0] = the sum of the words
void sum_body(void** p, dim3, dim3) {
  const uint64_t* buffer = arg<const uint64_t*>(p, 0);
  const uint64_t words = arg<uint64_t>(p, 1);
  uint64_t* out = arg<uint64_t*>(p, 2);
  uint64_t sum = 0;
  for (uint64_t i = 0; i < words; ++i) sum += buffer[i];
  out[0] = sum;
}

void registerKernels() {
  static const size_t three[] = {8, 8, 8};
  cudasimRegisterKernel(reinterpret_cast<const void*>(&fill_kernel), "vmm_fill", fill_body, 3, three);
  cudasimRegisterKernel(reinterpret_cast<const void*>(&sum_kernel), "vmm_sum", sum_body, 3, three);
}

void fill(CUdeviceptr at, uint64_t bytes, uint64_t seed) {
  uint64_t words = bytes / 8;
  void* pointer = reinterpret_cast<void*>(at);
  void* args[] = {&pointer, &words, &seed};
  CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(&fill_kernel), dim3(1), dim3(1), args, 0, nullptr));
}

uint64_t* gOut = nullptr;  // a small unmanaged result word

uint64_t sum(CUdeviceptr at, uint64_t bytes) {
  uint64_t words = bytes / 8;
  void* pointer = reinterpret_cast<void*>(at);
  void* args[] = {&pointer, &words, &gOut};
  CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(&sum_kernel), dim3(1), dim3(1), args, 0, nullptr));
  uint64_t value = 0;
  CHECK(cudaMemcpy(&value, gOut, sizeof value, cudaMemcpyDeviceToHost));
  return value;
}

// Fills the whole budget the test gives with managed buffers: everything else is evicted.
std::vector<CUdeviceptr> gFillers;
uint64_t gPressures = 0;
void pressure() {
  if (gFillers.empty())
    for (int i = 0; i < kFillers; ++i) {
      void* p = nullptr;
      CHECK(cudaMalloc(&p, kFiller));
      gFillers.push_back(reinterpret_cast<CUdeviceptr>(p));
    }
  for (CUdeviceptr filler : gFillers) fill(filler, kFiller, 1000 + gPressures);
  CHECK(cudaDeviceSynchronize());
  ++gPressures;
}

uint64_t shimEvictions() {
  using GetStats = int (*)(delta_stats*, size_t);
  auto get = reinterpret_cast<GetStats>(dlsym(RTLD_DEFAULT, "delta_get_stats"));
  delta_stats stats{};
  return get != nullptr && get(&stats, sizeof stats) == 0 ? stats.evictions : 0;
}

CUmemAllocationProp deviceProp(bool exportable) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  if (exportable) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

void setAccess(CUdeviceptr at, uint64_t bytes) {
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK_CU(cuMemSetAccess(at, bytes, &access, 1));
}

// A reservation and chunks mapped into it, as an expandable segment.
struct Segment {
  CUdeviceptr base = 0;
  uint64_t reserved = 0;
  std::vector<CUmemGenericAllocationHandle> handles;
  explicit Segment(int chunks, uint64_t reserve = 64 << 20, bool exportable = true)
      : reserved(reserve) {
    CHECK_CU(cuMemAddressReserve(&base, reserved, 0, 0, 0));
    const CUmemAllocationProp prop = deviceProp(exportable);
    for (int i = 0; i < chunks; ++i) {
      CUmemGenericAllocationHandle handle = 0;
      CHECK_CU(cuMemCreate(&handle, kChunk, &prop, 0));
      CHECK_CU(cuMemMap(base + i * kChunk, kChunk, 0, handle, 0));
      setAccess(base + i * kChunk, kChunk);
      handles.push_back(handle);
    }
  }
  CUdeviceptr at(int chunk) const { return base + chunk * kChunk; }
};

// ---- scenarios ----

// The program unmaps, in one call, chunks some of which the shim evicted (already unmapped), maps
// the same handles again elsewhere, and finds their contents.
void evictedUnmapRemap() {
  Segment s(4);
  for (int i = 0; i < 4; ++i) fill(s.at(i), kChunk, 10 + i);
  CHECK(cudaDeviceSynchronize());
  EXPECT(sum(s.at(1), kChunk) == expectedSum(11, kChunk / 8));  // one of them resident again
  pressure();
  CHECK_CU(cuMemUnmap(s.base, 4 * kChunk));
  // Mapped again in reverse order, higher in the reservation.
  for (int i = 0; i < 4; ++i) {
    const CUdeviceptr at = s.base + (8 + 3 - i) * kChunk;
    CHECK_CU(cuMemMap(at, kChunk, 0, s.handles[i], 0));
    setAccess(at, kChunk);
  }
  for (int i = 0; i < 4; ++i)
    EXPECT(sum(s.base + (8 + 3 - i) * kChunk, kChunk) == expectedSum(10 + i, kChunk / 8));
  CHECK_CU(cuMemUnmap(s.base + 8 * kChunk, 4 * kChunk));
  for (CUmemGenericAllocationHandle handle : s.handles) CHECK_CU(cuMemRelease(handle));
  CHECK_CU(cuMemAddressFree(s.base, s.reserved));
}

// Released while mapped: the mapping keeps the memory (and its contents through evictions); the
// handle is gone once unmapped, and releasing it again is the driver's error.
void releaseWhileMapped() {
  Segment s(2);
  fill(s.at(0), 2 * kChunk, 20);
  CHECK(cudaDeviceSynchronize());
  CHECK_CU(cuMemRelease(s.handles[0]));
  CHECK_CU(cuMemRelease(s.handles[1]));
  pressure();
  EXPECT(sum(s.at(0), 2 * kChunk) == expectedSum(20, 2 * kChunk / 8));
  pressure();
  CHECK_CU(cuMemUnmap(s.base, 2 * kChunk));
  EXPECT(cuMemRelease(s.handles[0]) != CUDA_SUCCESS);
  CHECK_CU(cuMemAddressFree(s.base, s.reserved));
}

// An exported handle: the importer maps the very memory, with its contents, and the program's
// mapping never moves again (both views agree after more pressure and a write through one).
void exportPins() {
  Segment s(1);
  fill(s.at(0), kChunk, 30);
  CHECK(cudaDeviceSynchronize());
  pressure();
  int fd = -1;
  CHECK_CU(cuMemExportToShareableHandle(&fd, s.handles[0], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  EXPECT(fd >= 0);
  CUmemGenericAllocationHandle imported = 0;
  CHECK_CU(cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(fd);
  const CUdeviceptr view = s.base + 16 * kChunk;
  CHECK_CU(cuMemMap(view, kChunk, 0, imported, 0));
  setAccess(view, kChunk);
  EXPECT(sum(view, kChunk) == expectedSum(30, kChunk / 8));
  pressure();
  fill(view, kChunk, 31);
  EXPECT(sum(s.at(0), kChunk) == expectedSum(31, kChunk / 8));
  CHECK_CU(cuMemUnmap(view, kChunk));
  CHECK_CU(cuMemRelease(imported));
  CHECK_CU(cuMemUnmap(s.base, kChunk));
  CHECK_CU(cuMemRelease(s.handles[0]));
  CHECK_CU(cuMemAddressFree(s.base, s.reserved));
}

// The handle found from an address is the one the program holds; its properties are those it
// asked for; both whether the mapping is resident or not.
void retainAndProperties() {
  Segment s(2);
  fill(s.at(0), 2 * kChunk, 40);
  for (int round = 0; round < 2; ++round) {
    if (round == 1) pressure();
    CUmemGenericAllocationHandle found = 0;
    CHECK_CU(cuMemRetainAllocationHandle(&found, reinterpret_cast<void*>(s.at(1))));
    EXPECT(found == s.handles[1]);
    CHECK_CU(cuMemRelease(found));
    CUmemAllocationProp prop{};
    CHECK_CU(cuMemGetAllocationPropertiesFromHandle(&prop, s.handles[0]));
    EXPECT(prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE && prop.location.id == 0);
    EXPECT(prop.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  }
  EXPECT(sum(s.at(0), 2 * kChunk) == expectedSum(40, 2 * kChunk / 8));
  CHECK_CU(cuMemUnmap(s.base, 2 * kChunk));
  for (CUmemGenericAllocationHandle handle : s.handles) CHECK_CU(cuMemRelease(handle));
  CHECK_CU(cuMemAddressFree(s.base, s.reserved));
}

// Blocks that straddle chunks: one declared (only its two chunks come back), one not (its pointer
// reaches to the end of the run of mappings). A kernel reading either finds every byte.
void straddlingBlocks() {
  Segment s(5);
  using Declare = int (*)(const void*, size_t);
  auto declare = reinterpret_cast<Declare>(dlsym(RTLD_DEFAULT, "delta_declare_extent"));
  const CUdeviceptr declared = s.at(0) + kChunk / 2;  // 1.5 chunks: over the first boundary
  const uint64_t declaredBytes = kChunk + kChunk / 2;
  const CUdeviceptr open = s.at(2) + kChunk / 4;      // 2.5 chunks: to the end of the fifth
  const uint64_t openBytes = 2 * kChunk + kChunk / 2;
  if (declare != nullptr) {
    EXPECT(declare(reinterpret_cast<void*>(declared), declaredBytes) == 0);
    EXPECT(declare(reinterpret_cast<void*>(s.base + s.reserved - 4096), 4096) == -1);  // unmapped
  }
  fill(declared, declaredBytes, 50);
  fill(open, openBytes, 51);
  CHECK(cudaDeviceSynchronize());
  for (int round = 0; round < 2; ++round) {
    pressure();
    EXPECT(sum(declared, declaredBytes) == expectedSum(50, declaredBytes / 8));
    pressure();
    EXPECT(sum(open, openBytes) == expectedSum(51, openBytes / 8));
  }
  CHECK_CU(cuMemUnmap(s.base, 5 * kChunk));
  for (CUmemGenericAllocationHandle handle : s.handles) CHECK_CU(cuMemRelease(handle));
  CHECK_CU(cuMemAddressFree(s.base, s.reserved));
}

// A handle mapped a second time (an alias): both mappings show the same memory from then on.
void secondMappingPins() {
  Segment s(1, 64 << 20, false);
  fill(s.at(0), kChunk, 60);
  CHECK(cudaDeviceSynchronize());
  pressure();
  const CUdeviceptr alias = s.base + 20 * kChunk;
  CHECK_CU(cuMemMap(alias, kChunk, 0, s.handles[0], 0));
  setAccess(alias, kChunk);
  EXPECT(sum(alias, kChunk) == expectedSum(60, kChunk / 8));
  fill(s.at(0), kChunk, 61);
  pressure();
  EXPECT(sum(alias, kChunk) == expectedSum(61, kChunk / 8));
  EXPECT(sum(s.at(0), kChunk) == expectedSum(61, kChunk / 8));
  CHECK_CU(cuMemUnmap(alias, kChunk));
  CHECK_CU(cuMemUnmap(s.base, kChunk));
  CHECK_CU(cuMemRelease(s.handles[0]));
  CHECK_CU(cuMemAddressFree(s.base, s.reserved));
}

// Copies and memsets into the program's memory, and a read-only view for another use: the
// mapping with access other than the device's read-write stays put.
void copiesAndAccess() {
  Segment s(3);
  std::vector<uint64_t> host(kChunk / 8);
  for (uint64_t i = 0; i < host.size(); ++i) host[i] = word(70, i);
  CHECK(cudaMemcpy(reinterpret_cast<void*>(s.at(1)), host.data(), kChunk, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(reinterpret_cast<void*>(s.at(2)), 0, kChunk));
  pressure();
  CHECK(cudaMemcpy(reinterpret_cast<void*>(s.at(0)), reinterpret_cast<void*>(s.at(1)), kChunk,
                   cudaMemcpyDeviceToDevice));
  pressure();
  EXPECT(sum(s.at(0), kChunk) == expectedSum(70, kChunk / 8));
  EXPECT(sum(s.at(2), kChunk) == 0);
  pressure();
  CUmemAccessDesc readOnly{};
  readOnly.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  readOnly.location.id = 0;
  readOnly.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
  CHECK_CU(cuMemSetAccess(s.at(1), kChunk, &readOnly, 1));
  pressure();
  EXPECT(sum(s.at(1), kChunk) == expectedSum(70, kChunk / 8));
  std::vector<uint64_t> back(kChunk / 8);
  CHECK(cudaMemcpy(back.data(), reinterpret_cast<void*>(s.at(0)), kChunk, cudaMemcpyDeviceToHost));
  EXPECT(back == host);
  CHECK_CU(cuMemUnmap(s.base, 3 * kChunk));
  for (CUmemGenericAllocationHandle handle : s.handles) CHECK_CU(cuMemRelease(handle));
  CHECK_CU(cuMemAddressFree(s.base, s.reserved));
}

// Calls the driver refuses, and memory the shim does not stand in for (another ordinal's, the
// host's): each answer printed (`answer_<call>: CUresult`), to be the same with the shim as
// without it.
void badInputPassesThrough() {
  auto answer = [](const char* call, CUresult result) {
    std::printf("answer_%s: %d\n", call, static_cast<int>(result));
  };
  CUmemAllocationProp prop = deviceProp(false);
  CUmemGenericAllocationHandle handle = 0;
  answer("create_unaligned", cuMemCreate(&handle, kChunk + 4096, &prop, 0));
  answer("create_flags", cuMemCreate(&handle, kChunk, &prop, 1));
  prop.location.id = 7;
  answer("create_no_such_device", cuMemCreate(&handle, kChunk, &prop, 0));
  prop = deviceProp(false);
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
  answer("create_host", cuMemCreate(&handle, kChunk, &prop, 0));
  answer("release_bogus", cuMemRelease(0x1234));
  CUdeviceptr base = 0;
  CHECK_CU(cuMemAddressReserve(&base, 4 * kChunk, 0, 0, 0));
  answer("map_bogus", cuMemMap(base, kChunk, 0, 0x1234, 0));
  answer("unmap_unmapped", cuMemUnmap(base, kChunk));
  prop = deviceProp(false);
  CHECK_CU(cuMemCreate(&handle, kChunk, &prop, 0));
  answer("map_past_handle", cuMemMap(base, 2 * kChunk, 0, handle, 0));
  answer("map_flags", cuMemMap(base, kChunk, 0, handle, 1));
  answer("map", cuMemMap(base, kChunk, 0, handle, 0));
  answer("map_again_same_place", cuMemMap(base, kChunk, 0, handle, 0));
  answer("unmap_part", cuMemUnmap(base, kChunk / 2));
  answer("unmap_beyond", cuMemUnmap(base, 2 * kChunk));
  answer("unmap", cuMemUnmap(base, kChunk));
  answer("release", cuMemRelease(handle));
  answer("release_again", cuMemRelease(handle));
  CHECK_CU(cuMemAddressFree(base, 4 * kChunk));
}

const std::map<std::string, std::function<void()>>& scenarios() {
  static const std::map<std::string, std::function<void()>> all = {
      {"evicted-unmap-remap", evictedUnmapRemap},   {"release-while-mapped", releaseWhileMapped},
      {"export-pins", exportPins},                  {"retain-and-properties", retainAndProperties},
      {"straddling-blocks", straddlingBlocks},      {"second-mapping-pins", secondMappingPins},
      {"copies-and-access", copiesAndAccess},       {"bad-input", badInputPassesThrough},
  };
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: vmm-probe SCENARIO   (vmm-probe list)\n");
    return 2;
  }
  const std::string name = argv[1];
  if (name == "list") {
    for (const auto& [scenario, run] : scenarios()) std::printf("%s\n", scenario.c_str());
    return 0;
  }
  auto it = scenarios().find(name);
  if (it == scenarios().end()) {
    std::fprintf(stderr, "vmm-probe: no scenario '%s' (vmm-probe list)\n", name.c_str());
    return 2;
  }
  registerKernels();
  CHECK(cudaMalloc(reinterpret_cast<void**>(&gOut), 4096));
  const uint64_t before = shimEvictions();
  it->second();
  CHECK(cudaDeviceSynchronize());
  std::printf("%s: ok\n", name.c_str());
  std::printf("evictions: %llu\n", static_cast<unsigned long long>(shimEvictions() - before));
  return 0;
}
