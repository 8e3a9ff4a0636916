/* cudasim's environment switches, each checked in a fresh child process:
 * CUDASIM_DEVICE_MEMORY (capacity, K/M/G suffixes, default 4G; a fragmented device),
 * CUDASIM_WARM_MEMORY (device memory written once at start: resident, still zero),
 * CUDASIM_WARM_HOST_MEMORY (pinned memory made once at start and handed out from there, while
 *   another thread copies),
 * CUDASIM_DEVICE_COUNT=0,
 * CUDASIM_CUPTI_DRIVER_CALLBACKS=0, CUDASIM_CUPTI_HELD_BY. */
#include <cupti.h>

#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "conformance_util.h"

namespace conformance {
namespace {

int ChildContext() {
  if (CUresult r = cuInit(0); r != CUDA_SUCCESS) return ChildFail("cuInit", r, 0);
  CUdevice dev;
  CUcontext ctx;
  cuDeviceGet(&dev, 0);
  if (CUresult r = cuDevicePrimaryCtxRetain(&ctx, dev); r != CUDA_SUCCESS)
    return ChildFail("retain", r, 0);
  if (CUresult r = cuCtxSetCurrent(ctx); r != CUDA_SUCCESS) return ChildFail("set current", r, 0);
  return 0;
}

// args: expected capacity in bytes
CONFORMANCE_CHILD(capacity) {
  if (int rc = ChildContext(); rc != 0) return rc;
  const unsigned long long expected = std::stoull(args.at(0));
  size_t free_b = 0, total = 0;
  if (CUresult r = cuMemGetInfo(&free_b, &total); r != CUDA_SUCCESS) return ChildFail("cuMemGetInfo", r, 0);
  if (total != expected) return ChildFail("cuMemGetInfo total", total, expected);
  size_t dev_total = 0;
  cuDeviceTotalMem(&dev_total, 0);
  if (dev_total != expected) return ChildFail("cuDeviceTotalMem", dev_total, expected);
  size_t rt_free = 0, rt_total = 0;
  if (cudaError_t e = cudaMemGetInfo(&rt_free, &rt_total); e != cudaSuccess)
    return ChildFail("cudaMemGetInfo", e, 0);
  if (rt_total != expected) return ChildFail("cudaMemGetInfo total", rt_total, expected);
  // Fill three quarters; a half more does not fit, in either API.
  CUdeviceptr big = 0;
  if (CUresult r = cuMemAlloc(&big, expected / 4 * 3); r != CUDA_SUCCESS)
    return ChildFail("cuMemAlloc 3/4 of capacity", r, 0);
  CUdeviceptr more = 0;
  if (CUresult r = cuMemAlloc(&more, expected / 2); r != CUDA_ERROR_OUT_OF_MEMORY)
    return ChildFail("cuMemAlloc past capacity", r, CUDA_ERROR_OUT_OF_MEMORY);
  void* rt = nullptr;
  if (cudaError_t e = cudaMalloc(&rt, expected / 2); e != cudaErrorMemoryAllocation)
    return ChildFail("cudaMalloc past capacity", e, cudaErrorMemoryAllocation);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  size_t gran = 0;
  cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  CUmemGenericAllocationHandle h;
  size_t vsize = (expected / 2 + gran - 1) / gran * gran;
  if (CUresult r = cuMemCreate(&h, vsize, &prop, 0); r != CUDA_ERROR_OUT_OF_MEMORY)
    return ChildFail("cuMemCreate past capacity", r, CUDA_ERROR_OUT_OF_MEMORY);
  if (CUresult r = cuMemFree(big); r != CUDA_SUCCESS) return ChildFail("cuMemFree", r, 0);
  if (CUresult r = cuMemAlloc(&more, expected / 2); r != CUDA_SUCCESS)
    return ChildFail("cuMemAlloc after free", r, 0);
  return 0;
}

void ExpectCapacity(const char* setting, unsigned long long bytes) {
  ChildOptions opt;
  opt.args = {std::to_string(bytes)};
  if (setting != nullptr) {
    opt.set_env = {{"CUDASIM_DEVICE_MEMORY", setting}};
  } else {
    opt.unset_env = {"CUDASIM_DEVICE_MEMORY"};
  }
  ChildResult r = RunChild("capacity", opt);
  EXPECT_TRUE(r.exited && r.exit_code == 0)
      << "CUDASIM_DEVICE_MEMORY=" << (setting ? setting : "(unset)") << "\n" << r.output;
}

TEST(PlatformEnv, CapacityDefaultsToFourGiB) { ExpectCapacity(nullptr, 4ull << 30); }
TEST(PlatformEnv, CapacityInMegabytes) { ExpectCapacity("256M", 256ull << 20); }
TEST(PlatformEnv, CapacityInGigabytes) { ExpectCapacity("1G", 1ull << 30); }
TEST(PlatformEnv, CapacityInKilobytes) { ExpectCapacity("131072K", 128ull << 20); }
TEST(PlatformEnv, CapacityInPlainBytes) { ExpectCapacity("134217728", 128ull << 20); }

// 16 MiB device cut into 2 MiB holes between small allocations: a 6 MiB cuMemCreate still gets
// its memory (a GPU maps physical memory page by page), maps, holds what is written through the
// mapping, and gives every piece back; cuMemAlloc's memory stays one run, so it fails.
CONFORMANCE_CHILD(fragmented) {
  if (int rc = ChildContext(); rc != 0) return rc;
  constexpr size_t kMiB = 1 << 20;
  CUdeviceptr chunks[8] = {};
  for (CUdeviceptr& chunk : chunks)
    if (CUresult r = cuMemAlloc(&chunk, 2 * kMiB - 4096); r != CUDA_SUCCESS)
      return ChildFail("cuMemAlloc of a chunk", r, 0);
  // Free every other chunk: 4 holes of 2 MiB - 4 KiB, each next to a 4 KiB gap... and 4 KiB.
  for (int i = 0; i < 8; i += 2) cuMemFree(chunks[i]);
  CUdeviceptr contiguous = 0;
  if (CUresult r = cuMemAlloc(&contiguous, 6 * kMiB); r != CUDA_ERROR_OUT_OF_MEMORY)
    return ChildFail("cuMemAlloc needing one free run", r, CUDA_ERROR_OUT_OF_MEMORY);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemGenericAllocationHandle handle;
  if (CUresult r = cuMemCreate(&handle, 6 * kMiB, &prop, 0); r != CUDA_SUCCESS)
    return ChildFail("cuMemCreate from pieces", r, 0);
  CUdeviceptr va = 0;
  if (CUresult r = cuMemAddressReserve(&va, 6 * kMiB, 0, 0, 0); r != CUDA_SUCCESS)
    return ChildFail("reserve", r, 0);
  if (CUresult r = cuMemMap(va, 6 * kMiB, 0, handle, 0); r != CUDA_SUCCESS)
    return ChildFail("map", r, 0);
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (CUresult r = cuMemSetAccess(va, 6 * kMiB, &access, 1); r != CUDA_SUCCESS)
    return ChildFail("access", r, 0);
  std::vector<unsigned char> pattern(6 * kMiB), back(6 * kMiB);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<unsigned char>(i * 7 + i / 4096);
  if (CUresult r = cuMemcpyHtoD(va, pattern.data(), pattern.size()); r != CUDA_SUCCESS)
    return ChildFail("copy in", r, 0);
  if (CUresult r = cuMemcpyDtoH(back.data(), va, back.size()); r != CUDA_SUCCESS)
    return ChildFail("copy out", r, 0);
  if (pattern != back) return ChildFail("contents through a mapping of pieces", 1, 0);
  // Part of the handle, at an offset that falls inside a piece.
  CUdeviceptr part = 0;
  cuMemAddressReserve(&part, 2 * kMiB, 0, 0, 0);
  if (CUresult r = cuMemMap(part, 2 * kMiB, 2 * kMiB, handle, 0); r != CUDA_SUCCESS)
    return ChildFail("map at an offset", r, 0);
  cuMemSetAccess(part, 2 * kMiB, &access, 1);
  std::vector<unsigned char> middle(2 * kMiB);
  cuMemcpyDtoH(middle.data(), part, middle.size());
  if (std::memcmp(middle.data(), pattern.data() + 2 * kMiB, middle.size()) != 0)
    return ChildFail("contents at an offset", 1, 0);
  cuMemUnmap(part, 2 * kMiB);
  cuMemUnmap(va, 6 * kMiB);
  if (CUresult r = cuMemRelease(handle); r != CUDA_SUCCESS) return ChildFail("release", r, 0);
  // Every piece came back: the holes take cuMemAlloc chunks again.
  for (int i = 0; i < 8; i += 2)
    if (CUresult r = cuMemAlloc(&chunks[i], 2 * kMiB - 4096); r != CUDA_SUCCESS)
      return ChildFail("cuMemAlloc after the release", r, 0);
  return 0;
}

TEST(PlatformEnv, AFragmentedDeviceStillGivesPhysicalMemoryInPieces) {
  ChildOptions opt;
  opt.set_env = {{"CUDASIM_DEVICE_MEMORY", "16M"}};
  ChildResult r = RunChild("fragmented", opt);
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
}

// One of this process's resident-memory counts from /proc/self/status ("RssShmem": the device
// memory file's pages; "RssAnon": anonymous memory, pinned memory's), in bytes.
unsigned long long ResidentBytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
  return 0;
}

// args: the least and the most device memory resident after cuInit, in bytes
CONFORMANCE_CHILD(warm) {
  if (int rc = ChildContext(); rc != 0) return rc;
  const unsigned long long least = std::stoull(args.at(0)), most = std::stoull(args.at(1));
  const unsigned long long resident = ResidentBytes("RssShmem");
  if (resident < least) return ChildFail("resident device memory below", resident, least);
  if (resident > most) return ChildFail("resident device memory above", resident, most);
  // Memory from the warmed part reads zero, as fresh device memory here always has, and works.
  constexpr size_t kBytes = 4 << 20;
  CUdeviceptr d = 0;
  if (CUresult r = cuMemAlloc(&d, kBytes); r != CUDA_SUCCESS) return ChildFail("cuMemAlloc", r, 0);
  std::vector<unsigned char> back(kBytes, 0xff), pattern(kBytes);
  if (CUresult r = cuMemcpyDtoH(back.data(), d, kBytes); r != CUDA_SUCCESS)
    return ChildFail("copy out", r, 0);
  for (size_t i = 0; i < kBytes; ++i)
    if (back[i] != 0) return ChildFail("fresh memory at byte", i, 0);
  for (size_t i = 0; i < kBytes; ++i) pattern[i] = static_cast<unsigned char>(i * 13 + 1);
  cuMemcpyHtoD(d, pattern.data(), kBytes);
  cuMemcpyDtoH(back.data(), d, kBytes);
  if (back != pattern) return ChildFail("contents of warmed memory", 1, 0);
  return 0;
}

void ExpectWarm(const char* warm, const char* capacity, unsigned long long least,
                unsigned long long most) {
  ChildOptions opt;
  opt.args = {std::to_string(least), std::to_string(most)};
  opt.set_env = {{"CUDASIM_DEVICE_MEMORY", capacity}};
  if (warm != nullptr) opt.set_env.push_back({"CUDASIM_WARM_MEMORY", warm});
  else opt.unset_env = {"CUDASIM_WARM_MEMORY"};
  ChildResult r = RunChild("warm", opt);
  EXPECT_TRUE(r.exited && r.exit_code == 0)
      << "CUDASIM_WARM_MEMORY=" << (warm ? warm : "(unset)") << "\n" << r.output;
}

constexpr unsigned long long kMiB = 1ull << 20;

TEST(PlatformEnv, WarmMemoryIsResidentFromTheStart) {
  ExpectWarm(nullptr, "256M", 0, 8 * kMiB);
  ExpectWarm("0", "256M", 0, 8 * kMiB);
  ExpectWarm("64M", "256M", 64 * kMiB, 72 * kMiB);
  ExpectWarm("1G", "128M", 128 * kMiB, 136 * kMiB);  // at most the device's memory
}

TEST(PlatformEnv, ABadWarmMemoryStopsTheProgramWithOneLine) {
  for (const char* bad : {"lots", "-1M", "12X"}) {
    ChildOptions opt;
    opt.args = {"0", "0"};
    opt.set_env = {{"CUDASIM_WARM_MEMORY", bad}};
    ChildResult r = RunChild("warm", opt);
    EXPECT_TRUE(r.exited && r.exit_code == 2) << bad << "\n" << r.output;
    EXPECT_NE(r.output.find("CUDASIM_WARM_MEMORY='" + std::string(bad) + "' is not valid"),
              std::string::npos)
        << r.output;
  }
}

// args: the least anonymous memory resident after cuInit, in bytes
CONFORMANCE_CHILD(warm_host) {
  if (int rc = ChildContext(); rc != 0) return rc;
  const unsigned long long least = std::stoull(args.at(0));
  const unsigned long long resident = ResidentBytes("RssAnon");
  if (resident < least) return ChildFail("resident anonymous memory below", resident, least);
  // Allocations from the arena and past it: zeroed, usable, pinned as far as copies go.
  constexpr size_t kMiB = 1 << 20;
  void* blocks[3] = {};
  for (size_t i = 0; i < 3; ++i) {
    if (CUresult r = cuMemHostAlloc(&blocks[i], 24 * kMiB, 0); r != CUDA_SUCCESS)
      return ChildFail("cuMemHostAlloc", r, 0);
    auto* bytes = static_cast<unsigned char*>(blocks[i]);
    for (size_t at = 0; at < 24 * kMiB; at += 4096)
      if (bytes[at] != 0) return ChildFail("fresh pinned memory at byte", at, 0);
    std::memset(bytes, static_cast<int>(i + 1), 24 * kMiB);
  }
  CUdeviceptr d = 0;
  cuMemAlloc(&d, 24 * kMiB);
  CUstream stream = nullptr;
  cuStreamCreate(&stream, 0);
  if (CUresult r = cuMemcpyHtoDAsync(d, blocks[0], 24 * kMiB, stream); r != CUDA_SUCCESS)
    return ChildFail("copy in", r, 0);
  if (CUresult r = cuMemcpyDtoHAsync(blocks[1], d, 24 * kMiB, stream); r != CUDA_SUCCESS)
    return ChildFail("copy out", r, 0);
  cuStreamSynchronize(stream);
  if (std::memcmp(blocks[0], blocks[1], 24 * kMiB) != 0) return ChildFail("round trip", 1, 0);
  // Freed and allocated again: the same memory, zeroed again.
  if (CUresult r = cuMemFreeHost(blocks[0]); r != CUDA_SUCCESS) return ChildFail("free", r, 0);
  void* again = nullptr;
  cuMemHostAlloc(&again, 24 * kMiB, 0);
  if (static_cast<unsigned char*>(again)[4096] != 0)
    return ChildFail("reused memory not zero", 1, 0);
  // Freed pinned memory cannot be touched, arena or not.
  cuMemFreeHost(blocks[1]);
  pid_t child = fork();
  if (child == 0) {
    static_cast<volatile unsigned char*>(blocks[1])[0] = 1;
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGSEGV)
    return ChildFail("touching freed pinned memory did not fault", status, 0);
  return 0;
}

TEST(PlatformEnv, WarmHostMemoryIsPinnedOnceAndHandedOut) {
  for (const char* warm : {"", "40M", "128M"}) {
    ChildOptions opt;
    const unsigned long long least = std::string(warm) == "128M" ? 128ull << 20 : 0;
    opt.args = {std::to_string(least)};
    opt.set_env = {{"CUDASIM_WARM_HOST_MEMORY", warm}};
    ChildResult r = RunChild("warm_host", opt);
    EXPECT_TRUE(r.exited && r.exit_code == 0)
        << "CUDASIM_WARM_HOST_MEMORY=" << warm << "\n" << r.output;
  }
}

// Another thread pins and frees blocks (from the arena and past it) while this one copies
// through pinned memory it has: every copy lands whole, every fresh block reads zero, and what
// is pinned adds up at the end (under a pinned limit of 64 MiB, exactly what the two blocks
// held here leave can be pinned again, and not a MiB more).
CONFORMANCE_CHILD(pinning_beside_copies) {
  if (int rc = ChildContext(); rc != 0) return rc;
  CUcontext context = nullptr;
  cuCtxGetCurrent(&context);
  constexpr size_t kMiB = 1 << 20;
  std::atomic<int> failure{0};
  std::thread pinner([&] {
    cuCtxSetCurrent(context);
    for (int round = 0; round < 12 && failure == 0; ++round) {
      void* block = nullptr;
      const size_t bytes = (round % 3 + 1) * 16 * kMiB;
      if (cuMemHostAlloc(&block, bytes, 0) != CUDA_SUCCESS) {
        failure = 1;
        break;
      }
      auto* data = static_cast<unsigned char*>(block);
      for (size_t at = 0; at < bytes; at += 4096)
        if (data[at] != 0) failure = 2;
      std::memset(data, round + 1, bytes);
      if (cuMemFreeHost(block) != CUDA_SUCCESS) failure = 3;
    }
  });
  void* source = nullptr;
  void* target = nullptr;
  cuMemHostAlloc(&source, 4 * kMiB, 0);
  cuMemHostAlloc(&target, 4 * kMiB, 0);
  CUdeviceptr d = 0;
  cuMemAlloc(&d, 4 * kMiB);
  CUstream stream = nullptr;
  cuStreamCreate(&stream, 0);
  for (int round = 0; round < 200; ++round) {
    std::memset(source, round & 0xff, 4 * kMiB);
    if (CUresult r = cuMemcpyHtoDAsync(d, source, 4 * kMiB, stream); r != CUDA_SUCCESS)
      failure = 10;
    if (CUresult r = cuMemcpyDtoHAsync(target, d, 4 * kMiB, stream); r != CUDA_SUCCESS)
      failure = 11;
    cuStreamSynchronize(stream);
    if (std::memcmp(source, target, 4 * kMiB) != 0) failure = 12;
  }
  pinner.join();
  if (failure != 0) return ChildFail("failure", failure.load(), 0);
  void* rest = nullptr;
  if (CUresult r = cuMemHostAlloc(&rest, 56 * kMiB, 0); r != CUDA_SUCCESS)
    return ChildFail("pinning what the other thread gave back", r, 0);
  void* more = nullptr;
  if (CUresult r = cuMemHostAlloc(&more, kMiB, 0); r != CUDA_ERROR_OUT_OF_MEMORY)
    return ChildFail("pinning past the limit", r, CUDA_ERROR_OUT_OF_MEMORY);
  return 0;
}

TEST(PlatformEnv, PinningOnOneThreadLeavesCopiesOnAnotherWhole) {
  for (const char* warm : {"", "64M"}) {
    ChildOptions opt;
    opt.set_env = {{"CUDASIM_WARM_HOST_MEMORY", warm}, {"CUDASIM_FAULTS", "pinned-limit=64M"}};
    ChildResult r = RunChild("pinning_beside_copies", opt);
    EXPECT_TRUE(r.exited && r.exit_code == 0)
        << "CUDASIM_WARM_HOST_MEMORY=" << warm << "\n" << r.output;
  }
}

CONFORMANCE_CHILD(no_device) {
  if (CUresult r = cuInit(0); r != CUDA_ERROR_NO_DEVICE)
    return ChildFail("cuInit", r, CUDA_ERROR_NO_DEVICE);
  int count = -1;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaErrorNoDevice)
    return ChildFail("cudaGetDeviceCount", e, cudaErrorNoDevice);
  void* p = nullptr;
  if (cudaError_t e = cudaMalloc(&p, 16); e == cudaSuccess)
    return ChildFail("cudaMalloc without a device", e, cudaErrorNoDevice);
  return 0;
}

TEST(PlatformEnv, DeviceCountZeroMeansNoDevice) {
  ChildOptions opt;
  opt.set_env = {{"CUDASIM_DEVICE_COUNT", "0"}};
  ChildResult r = RunChild("no_device", opt);
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
}

// ---- CUPTI switches ----

struct Seen {
  int runtime_malloc = 0;
  int driver_alloc = 0;
};

void CUPTIAPI Count(void* userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  auto* seen = static_cast<Seen*>(userdata);
  auto* cb = static_cast<const CUpti_CallbackData*>(data);
  if (cb->callbackSite != CUPTI_API_ENTER) return;
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API && cbid == CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020)
    ++seen->runtime_malloc;
  if (domain == CUPTI_CB_DOMAIN_DRIVER_API && cbid == CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2)
    ++seen->driver_alloc;
}

// args: expected driver callbacks for one cudaMalloc (0 or 1)
CONFORMANCE_CHILD(runtime_internal_driver_callbacks) {
  if (cudaError_t e = cudaSetDevice(0); e != cudaSuccess) return ChildFail("cudaSetDevice", e, 0);
  Seen seen;
  CUpti_SubscriberHandle sub;
  if (CUptiResult r = cuptiSubscribe(&sub, Count, &seen); r != CUPTI_SUCCESS)
    return ChildFail("cuptiSubscribe", r, 0);
  cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API);
  cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_DRIVER_API);
  void* p = nullptr;
  if (cudaError_t e = cudaMalloc(&p, 4096); e != cudaSuccess) return ChildFail("cudaMalloc", e, 0);
  if (seen.runtime_malloc != 1) return ChildFail("runtime cudaMalloc callbacks", seen.runtime_malloc, 1);
  int expected = std::stoi(args.at(0));
  if (seen.driver_alloc != expected)
    return ChildFail("driver cuMemAlloc_v2 callbacks inside cudaMalloc", seen.driver_alloc, expected);
  // A direct driver call always raises its callback.
  CUdeviceptr d = 0;
  if (CUresult r = cuMemAlloc(&d, 4096); r != CUDA_SUCCESS) return ChildFail("cuMemAlloc", r, 0);
  if (seen.driver_alloc != expected + 1)
    return ChildFail("driver callbacks after direct cuMemAlloc", seen.driver_alloc, expected + 1);
  cuptiUnsubscribe(sub);
  return 0;
}

TEST(PlatformEnv, RuntimeCallsRaiseDriverCallbacksByDefault) {
  ChildOptions opt;
  opt.args = {"1"};
  opt.unset_env = {"CUDASIM_CUPTI_DRIVER_CALLBACKS"};
  ChildResult r = RunChild("runtime_internal_driver_callbacks", opt);
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
}

TEST(PlatformEnv, DriverCallbacksSwitchOffSilencesRuntimeInternalDriverCalls) {
  ChildOptions opt;
  opt.args = {"0"};
  opt.set_env = {{"CUDASIM_CUPTI_DRIVER_CALLBACKS", "0"}};
  ChildResult r = RunChild("runtime_internal_driver_callbacks", opt);
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
}

// args: tool name expected in the v2 report
CONFORMANCE_CHILD(cupti_held) {
  if (CUresult r = cuInit(0); r != CUDA_SUCCESS) return ChildFail("cuInit", r, 0);
  CUpti_SubscriberHandle sub = nullptr;
  if (CUptiResult r = cuptiSubscribe(&sub, Count, nullptr);
      r != CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
    return ChildFail("cuptiSubscribe while held", r, CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
  char old_name[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN + 64] = {};
  CUpti_SubscriberParams params{};
  params.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
  params.subscriberName = "conformance";
  params.oldSubscriberName = old_name;
  params.oldSubscriberSize = sizeof old_name;
  if (CUptiResult r = cuptiSubscribe_v2(&sub, Count, nullptr, &params);
      r != CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
    return ChildFail("cuptiSubscribe_v2 while held", r, CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
  if (std::strstr(old_name, args.at(0).c_str()) == nullptr) {
    std::fprintf(stderr, "child: old subscriber name '%s' does not name '%s'\n", old_name,
                 args.at(0).c_str());
    return 1;
  }
  return 0;
}

TEST(PlatformEnv, CuptiHeldByAnotherToolRefusesSubscribersAndNamesIt) {
  ChildOptions opt;
  opt.args = {"Nsight Systems"};
  opt.set_env = {{"CUDASIM_CUPTI_HELD_BY", "Nsight Systems"}};
  ChildResult r = RunChild("cupti_held", opt);
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
}

}  // namespace
}  // namespace conformance
