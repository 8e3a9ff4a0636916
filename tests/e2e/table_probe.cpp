// table-probe: one way of reaching managed buffers through device memory per run, each checked
// for what a kernel reads, for tests/e2e/tables_e2e_test.cpp. Under libdelta.so with a budget of
// three buffers (DELTA_BUDGET=12M), every scenario evicts its targets before the kernel that
// reaches them through a table; a target the shim failed to bring back makes cudasim stop with
// "illegal address", and a wrong sum fails the run.
//
// usage: table-probe SCENARIO    (table-probe list: the scenarios, one per line)
// Prints `scenario: ok`, and, under the shim, `restores_for_last_launch: N` where the scenario
// measures what a launch brought back. Exit status 0 ok, 1 a check or a CUDA call failed, 2 usage.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cudasim/cudasim.h>
#include <dlfcn.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>

#include "shim/include/delta/delta.h"

namespace {

constexpr uint64_t kBytes = 4 << 20;  // every target and filler: managed (>= 1 MiB)
constexpr uint64_t kWords = kBytes / 8;
constexpr int kFillers = 3;           // as much as the budget the test gives

[[noreturn]] void fail(const std::string& what) {
  std::fflush(stdout);
  std::fprintf(stderr, "table-probe: %s\n", what.c_str());
  std::exit(1);
}
#define CHECK(call)                                                                     \
  do {                                                                                  \
    if (cudaError_t e_ = (call); e_ != cudaSuccess)                                     \
      fail(std::string(#call) + " failed: " + cudaGetErrorString(e_));                  \
  } while (0)

template <typename T>
T arg(void** params, int i) {
  return *static_cast<T*>(params[i]);
}

uint64_t word(uint64_t seed, uint64_t i) { return seed * 0x9E3779B97F4A7C15ull + i; }
uint64_t expectedSum(uint64_t seed) {
  uint64_t sum = 0;
  for (uint64_t i = 0; i < kWords; ++i) sum += word(seed, i);
  return sum;
}
uint64_t sumOf(const uint64_t* buffer) {
  uint64_t sum = 0;
  for (uint64_t i = 0; i < kWords; ++i) sum += buffer[i];
  return sum;
}

// ---- kernels ----
void fill_kernel() {}
void sum_table_kernel() {}
void sum_struct_kernel() {}
void sum_nested_kernel() {}
void build_table_kernel() {}

struct TableRef {  // passed by value: the table is a field
  int32_t count;
  int32_t unused;
  const uint64_t* const* table;
};

void fill_body(void** p, dim3, dim3) {
  uint64_t* buffer = arg<uint64_t*>(p, 0);
  const uint64_t seed = arg<uint64_t>(p, 1);
  for (uint64_t i = 0; i < kWords; ++i) buffer[i] = word(seed, i);
}
// (table, count, out): out[0] = the sum of every word of table[0..count).
void sum_table_body(void** p, dim3, dim3) {
  const uint64_t* const* table = arg<const uint64_t* const*>(p, 0);
  const int count = arg<int>(p, 1);
  uint64_t sum = 0;
  for (int k = 0; k < count; ++k) sum += sumOf(table[k]);
  arg<uint64_t*>(p, 2)[0] = sum;
}
void sum_struct_body(void** p, dim3, dim3) {
  const TableRef ref = arg<TableRef>(p, 0);
  uint64_t sum = 0;
  for (int k = 0; k < ref.count; ++k) sum += sumOf(ref.table[k]);
  arg<uint64_t*>(p, 1)[0] = sum;
}
// (outer, count, out): outer[0] is a table of `count` buffers.
void sum_nested_body(void** p, dim3, dim3) {
  const uint64_t* const* inner = arg<const uint64_t* const* const*>(p, 0)[0];
  const int count = arg<int>(p, 1);
  uint64_t sum = 0;
  for (int k = 0; k < count; ++k) sum += sumOf(inner[k]);
  arg<uint64_t*>(p, 2)[0] = sum;
}
// (table, a, b): a kernel writes the table; the shim cannot see what it writes.
void build_table_body(void** p, dim3, dim3) {
  const uint64_t** table = arg<const uint64_t**>(p, 0);
  table[0] = arg<const uint64_t*>(p, 1);
  table[1] = arg<const uint64_t*>(p, 2);
}

void registerKernels() {
  static const size_t fill[] = {8, 8};
  static const size_t sumTable[] = {8, 4, 8};
  static const size_t sumStruct[] = {sizeof(TableRef), 8};
  static const size_t build[] = {8, 8, 8};
  auto key = [](void (*f)()) { return reinterpret_cast<const void*>(f); };
  cudasimRegisterKernel(key(fill_kernel), "probe_fill", fill_body, 2, fill);
  cudasimRegisterKernel(key(sum_table_kernel), "probe_sum_table", sum_table_body, 3, sumTable);
  cudasimRegisterKernel(key(sum_struct_kernel), "probe_sum_struct", sum_struct_body, 2, sumStruct);
  cudasimRegisterKernel(key(sum_nested_kernel), "probe_sum_nested", sum_nested_body, 3, sumTable);
  cudasimRegisterKernel(key(build_table_kernel), "probe_build_table", build_table_body, 3, build);
}

void launch(void (*kernel)(), void** args) {
  CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), dim3(1), dim3(1), args, 0, nullptr));
}

#define CU_CHECK(call)                                                                  \
  do {                                                                                  \
    if (CUresult r_ = (call); r_ != CUDA_SUCCESS) fail(std::string(#call) + " failed: " + std::to_string(r_)); \
  } while (0)

// ---- the probe ----

class Probe {
 public:
  Probe() {
    if (void* f = dlsym(RTLD_DEFAULT, "delta_get_stats"))
      getStats_ = reinterpret_cast<int (*)(delta_stats*, size_t)>(f);
    if (void* f = dlsym(RTLD_DEFAULT, "delta_pin")) pin_ = reinterpret_cast<int (*)(const void*)>(f);
  }

  uint64_t* target(uint64_t seed) {
    uint64_t* buffer = nullptr;
    CHECK(cudaMalloc(reinterpret_cast<void**>(&buffer), kBytes));
    void* args[] = {&buffer, &seed};
    launch(fill_kernel, args);
    seeds_[buffer] = seed;
    return buffer;
  }
  uint64_t seedOf(const uint64_t* buffer) { return seeds_.at(buffer); }

  void* small(size_t bytes = 64) {
    void* p = nullptr;
    CHECK(cudaMalloc(&p, bytes));
    CHECK(cudaMemset(p, 0, bytes));
    return p;
  }
  void setTable(void* table, std::initializer_list<const void*> pointers,
                cudaMemcpyKind kind = cudaMemcpyHostToDevice) {
    const void* words[8] = {};
    size_t n = 0;
    for (const void* p : pointers) words[n++] = p;
    CHECK(cudaMemcpy(table, words, n * sizeof(void*), kind));
  }

  // Fills every filler buffer: under the budget, everything else is evicted.
  void evictEverythingElse() {
    for (int i = 0; i < kFillers; ++i) {
      if (fillers_[i] == nullptr) CHECK(cudaMalloc(reinterpret_cast<void**>(&fillers_[i]), kBytes));
      uint64_t seed = 1000 + static_cast<uint64_t>(i);
      void* args[] = {&fillers_[i], &seed};
      launch(fill_kernel, args);
    }
    CHECK(cudaDeviceSynchronize());
  }

  uint64_t restores() {
    delta_stats stats{};
    if (getStats_ == nullptr || getStats_(&stats, sizeof stats) != 0) return 0;
    return stats.restores;
  }
  bool underShim() {
    delta_stats stats{};
    return getStats_ != nullptr && getStats_(&stats, sizeof stats) == 0;
  }
  bool pin(const void* p) { return pin_ != nullptr && pin_(p) == 0; }

  // Sums `count` buffers through `table` (a device address, possibly interior) and checks it.
  void sumThrough(const void* table, int count, uint64_t expected, const char* what) {
    uint64_t* out = result();
    const uint64_t before = restores();
    void* args[] = {&table, &count, &out};
    launch(sum_table_kernel, args);
    check(out, expected, what, before);
  }
  void sumNested(const void* outer, int count, uint64_t expected, const char* what) {
    uint64_t* out = result();
    const uint64_t before = restores();
    void* args[] = {&outer, &count, &out};
    launch(sum_nested_kernel, args);
    check(out, expected, what, before);
  }
  // The same sum, launched through `how` (one of the launch entry points a program may use).
  void sumThroughEntryPoint(const std::string& how, const void* table, int count, uint64_t expected) {
    uint64_t* out = result();
    const uint64_t before = restores();
    void* args[] = {&table, &count, &out};
    cudaFunction_t function = nullptr;
    CHECK(cudaGetFuncBySymbol(&function, reinterpret_cast<const void*>(&sum_table_kernel)));
    CUfunction f = reinterpret_cast<CUfunction>(function);
    if (how == "cuLaunchKernel") {
      CU_CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr));
    } else if (how == "cuLaunchKernel-extra") {
      // The parameters packed in one buffer, at the offsets cuFuncGetParamInfo gives.
      struct Packed {
        const void* table;
        int count;
        int unused;
        uint64_t* out;
      } packed{table, count, 0, out};
      size_t size = sizeof packed;
      void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                       CU_LAUNCH_PARAM_END};
      CU_CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, extra));
    } else if (how == "cuLaunchKernelEx") {
      CUlaunchConfig config{};
      config.gridDimX = config.gridDimY = config.gridDimZ = 1;
      config.blockDimX = config.blockDimY = config.blockDimZ = 1;
      CU_CHECK(cuLaunchKernelEx(&config, f, args, nullptr));
    } else if (how == "cuLaunchCooperativeKernel") {
      CU_CHECK(cuLaunchCooperativeKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, args));
    } else if (how == "cudaLaunchKernelExC") {
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(1);
      config.blockDim = dim3(1);
      CHECK(cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(&sum_table_kernel), args));
    } else if (how == "per-thread-stream") {
      CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(&sum_table_kernel), dim3(1), dim3(1), args, 0,
                             cudaStreamPerThread));
      CHECK(cudaStreamSynchronize(cudaStreamPerThread));
    } else {
      fail("no entry point " + how);
    }
    check(out, expected, how.c_str(), before);
  }

  void sumStruct(const void* table, int count, uint64_t expected, const char* what) {
    uint64_t* out = result();
    TableRef ref{count, 0, static_cast<const uint64_t* const*>(table)};
    const uint64_t before = restores();
    void* args[] = {&ref, &out};
    launch(sum_struct_kernel, args);
    check(out, expected, what, before);
  }

 private:
  uint64_t* result() {
    if (out_ == nullptr) CHECK(cudaMalloc(reinterpret_cast<void**>(&out_), 64));
    return out_;
  }
  void check(uint64_t* out, uint64_t expected, const char* what, uint64_t restoresBefore) {
    uint64_t got = 0;
    CHECK(cudaMemcpy(&got, out, 8, cudaMemcpyDeviceToHost));
    if (got != expected)
      fail(std::string(what) + ": the kernel read a sum of " + std::to_string(got) + ", expected " +
           std::to_string(expected));
    if (underShim()) std::printf("restores_for_last_launch: %" PRIu64 "\n", restores() - restoresBefore);
  }

  int (*getStats_)(delta_stats*, size_t) = nullptr;
  int (*pin_)(const void*) = nullptr;
  uint64_t* fillers_[kFillers] = {};
  uint64_t* out_ = nullptr;
  std::map<const void*, uint64_t> seeds_;
};

using Scenario = std::function<void(Probe&)>;

const std::map<std::string, Scenario>& scenarios() {
  static const std::map<std::string, Scenario> all = {
      // A small (unmanaged) table set by a host copy.
      {"host-copy", [](Probe& p) {
         void* table = p.small();
         uint64_t* a = p.target(1);
         uint64_t* b = p.target(2);
         p.setTable(table, {a, b});
         p.evictEverythingElse();
         p.sumThrough(table, 2, expectedSum(1) + expectedSum(2), "host-copy");
       }},
      // The table is the process's first allocation: the shim is not active yet and learns its
      // extent from the driver.
      {"early-table", [](Probe& p) {
         void* table = nullptr;
         CHECK(cudaMalloc(&table, 64));
         uint64_t* a = p.target(3);
         p.setTable(table, {a});
         p.evictEverythingElse();
         p.sumThrough(table, 1, expectedSum(3), "early-table");
       }},
      // The kernel gets a pointer into the middle of the table.
      {"interior-pointer", [](Probe& p) {
         auto* table = static_cast<char*>(p.small(128));
         uint64_t* a = p.target(4);
         uint64_t* b = p.target(5);
         p.setTable(table, {a, b});
         p.evictEverythingElse();
         p.sumThrough(table + 8, 1, expectedSum(5), "interior-pointer");
       }},
      // The table's address is a field of a struct passed by value.
      {"struct-field", [](Probe& p) {
         void* table = p.small();
         uint64_t* a = p.target(6);
         p.setTable(table, {a});
         p.evictEverythingElse();
         p.sumStruct(table, 1, expectedSum(6), "struct-field");
       }},
      // cudaMemcpyDefault and an async copy from pinned memory set tables too.
      {"default-and-async-copies", [](Probe& p) {
         void* first = p.small();
         void* second = p.small();
         uint64_t* a = p.target(7);
         uint64_t* b = p.target(8);
         p.setTable(first, {a}, cudaMemcpyDefault);
         const void** pinned = nullptr;
         CHECK(cudaMallocHost(reinterpret_cast<void**>(&pinned), 16));
         pinned[0] = b;
         cudaStream_t stream = nullptr;
         CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
         CHECK(cudaMemcpyAsync(second, pinned, 8, cudaMemcpyHostToDevice, stream));
         CHECK(cudaStreamSynchronize(stream));
         p.evictEverythingElse();
         p.sumThrough(first, 1, expectedSum(7), "default copy");
         p.evictEverythingElse();
         p.sumThrough(second, 1, expectedSum(8), "async copy");
         CHECK(cudaFreeHost(pinned));
       }},
      // A device-to-device copy of a table is a table, from a small one and from a managed one.
      {"device-copy", [](Probe& p) {
         void* original = p.small();
         void* copy = p.small();
         uint64_t* a = p.target(9);
         uint64_t* b = p.target(10);
         p.setTable(original, {a, b});
         CHECK(cudaMemcpy(copy, original, 16, cudaMemcpyDeviceToDevice));
         CHECK(cudaMemset(original, 0, 16));  // the copy keeps its pointers
         p.evictEverythingElse();
         p.sumThrough(copy, 2, expectedSum(9) + expectedSum(10), "device copy");
         void* managed = nullptr;
         CHECK(cudaMalloc(&managed, 2 << 20));
         CHECK(cudaMemcpy(static_cast<char*>(managed) + 256, copy, 16, cudaMemcpyDefault));
         void* back = p.small();
         CHECK(cudaMemcpy(back, static_cast<char*>(managed) + 256, 16, cudaMemcpyDeviceToDevice));
         p.evictEverythingElse();
         p.sumThrough(back, 2, expectedSum(9) + expectedSum(10), "copied through a managed buffer");
       }},
      // A table inside a managed buffer, at an offset.
      {"managed-table", [](Probe& p) {
         char* managed = nullptr;
         CHECK(cudaMalloc(reinterpret_cast<void**>(&managed), 2 << 20));
         uint64_t* a = p.target(11);
         uint64_t* b = p.target(12);
         p.setTable(managed + 4096, {a, b});
         p.evictEverythingElse();
         p.sumThrough(managed + 4096, 2, expectedSum(11) + expectedSum(12), "managed table");
       }},
      // A table written again: the launch brings back what it points to now, not before.
      {"table-reset", [](Probe& p) {
         void* table = p.small();
         uint64_t* a = p.target(13);
         uint64_t* b = p.target(14);
         p.setTable(table, {a});
         p.sumThrough(table, 1, expectedSum(13), "before the reset");
         p.setTable(table, {b});
         p.evictEverythingElse();
         p.sumThrough(table, 1, expectedSum(14), "after the reset");
       }},
      // A memset leaves no pointer: a launch given the table brings nothing back.
      {"table-memset", [](Probe& p) {
         void* table = p.small();
         uint64_t* a = p.target(15);
         uint64_t* b = p.target(16);
         p.setTable(table, {a, b});
         CHECK(cudaMemset(table, 0, 64));
         p.evictEverythingElse();
         p.sumThrough(table, 0, 0, "after the memset");
       }},
      // A freed table takes its pointers with it, even when its address comes back.
      {"table-freed", [](Probe& p) {
         void* table = p.small();
         uint64_t* a = p.target(17);
         p.setTable(table, {a});
         CHECK(cudaFree(table));
         void* next = p.small();
         p.evictEverythingElse();
         p.sumThrough(next, 0, 0, "a new allocation");
       }},
      // Tables of tables, the inner one written before or after the outer one.
      {"nested-tables", [](Probe& p) {
         void* inner = p.small();
         void* outer = p.small();
         uint64_t* a = p.target(18);
         uint64_t* b = p.target(19);
         p.setTable(inner, {a, b});
         p.setTable(outer, {inner});
         p.evictEverythingElse();
         p.sumNested(outer, 2, expectedSum(18) + expectedSum(19), "inner first");
         void* inner2 = p.small();
         void* outer2 = p.small();
         p.setTable(outer2, {inner2});
         p.setTable(inner2, {b, a});
         p.evictEverythingElse();
         p.sumNested(outer2, 2, expectedSum(18) + expectedSum(19), "outer first");
       }},
      // Every launch entry point a program may call: the parameters and the table they lead to.
      {"entry-points", [](Probe& p) {
         void* table = p.small();
         uint64_t* a = p.target(22);
         uint64_t* b = p.target(23);
         p.setTable(table, {a, b});
         for (const char* how : {"cuLaunchKernel", "cuLaunchKernel-extra", "cuLaunchKernelEx",
                                 "cuLaunchCooperativeKernel", "cudaLaunchKernelExC",
                                 "per-thread-stream"}) {
           p.evictEverythingElse();
           p.sumThroughEntryPoint(how, table, 2, expectedSum(22) + expectedSum(23));
         }
       }},
      // A table built by a kernel is invisible: its targets must be pinned (docs/shim.md).
      {"kernel-built-pinned", [](Probe& p) {
         void* table = p.small();
         uint64_t* a = p.target(20);
         uint64_t* b = p.target(21);
         void* args[] = {&table, &a, &b};
         launch(build_table_kernel, args);
         if (p.underShim() && !(p.pin(a) && p.pin(b))) fail("delta_pin failed");
         p.evictEverythingElse();
         p.sumThrough(table, 2, expectedSum(20) + expectedSum(21), "kernel-built table");
       }},
  };
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: table-probe SCENARIO|list\n");
    return 2;
  }
  const std::string name = argv[1];
  if (name == "list") {
    for (const auto& [scenario, run] : scenarios()) std::printf("%s\n", scenario.c_str());
    return 0;
  }
  auto it = scenarios().find(name);
  if (it == scenarios().end()) {
    std::fprintf(stderr, "table-probe: no scenario %s (table-probe list)\n", name.c_str());
    return 2;
  }
  registerKernels();
  Probe probe;
  it->second(probe);
  CHECK(cudaDeviceSynchronize());
  std::printf("%s: ok\n", name.c_str());
  return 0;
}
