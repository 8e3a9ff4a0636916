// DELTA_MODE=uvm: see uvm_mode.h.
#include "shim/uvm_mode.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "shim/log.h"
#include "shim/reentry_guard.h"
#include "shim/shim.h"

namespace delta::shim {
namespace {

// Set once by startUvmMode; never destroyed (frees may arrive during exit). Cleared in a
// forked child, which cannot use its parent's CUDA state.
std::atomic<UvmMode*> gMode{nullptr};

unsigned long long mib(uint64_t bytes) { return static_cast<unsigned long long>(bytes >> 20); }

// The driver's current version of `name` (cuMemAdvise and cuMemPrefetchAsync changed their
// signatures in CUDA 12.2; cuda.h's names are the current ones).
template <class F>
bool fetch(const DriverApi& driver, const char* name, F& out) {
  void* function = nullptr;
  if (driver.cuGetProcAddress_v2(name, &function, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT,
                                 nullptr) != CUDA_SUCCESS ||
      function == nullptr)
    return false;
  out = reinterpret_cast<F>(function);
  return true;
}

bool uvmSelected() {
  const Shim& shim = Shim::instance();
  return shim.options().mode == Options::Mode::kUvm && !shim.disabled();
}

}  // namespace

bool startUvmMode(const DriverApi& driver, CUdevice device, uint64_t budgetBytes) {
  auto* mode = new UvmMode(driver, device, budgetBytes);
  decltype(&::cuDeviceGetAttribute) getAttribute = nullptr;
  int concurrentManagedAccess = 0;
  // Without concurrent managed access (Windows, WSL, pre-Pascal GPUs) managed memory cannot
  // be larger than the device nor prefer it: there would be no baseline to measure.
  if (!fetch(driver, "cuMemAllocManaged", mode->allocManaged_) ||
      !fetch(driver, "cuMemAdvise", mode->advise_) ||
      !fetch(driver, "cuMemPrefetchAsync", mode->prefetch_) ||
      !fetch(driver, "cuDeviceGetAttribute", getAttribute) ||
      getAttribute(&concurrentManagedAccess, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
                   device) != CUDA_SUCCESS ||
      concurrentManagedAccess == 0) {
    delete mode;
    return false;
  }
  pthread_atfork(nullptr, nullptr, [] { gMode.store(nullptr); });
  if (Shim::instance().options().verbose >= 1) {
    std::atexit([] {
      if (UvmMode* started = gMode.load()) started->printSummary();
    });
  }
  logVerbose(1, "active: DELTA_MODE=uvm, budget %llu MiB; allocations of %llu bytes or more "
                "become managed memory",
             mib(budgetBytes), static_cast<unsigned long long>(Shim::instance().minManagedBytes()));
  gMode.store(mode, std::memory_order_release);
  return true;
}

UvmMode* uvmManaging(size_t bytes) {
  if (insideShim() || !uvmSelected() || bytes < Shim::instance().minManagedBytes()) return nullptr;
  if (UvmMode* mode = gMode.load(std::memory_order_acquire)) return mode;
  Shim::instance().active();  // starts the mode, or settles on passing everything through
  return gMode.load(std::memory_order_acquire);
}

UvmMode* uvmStarted() {
  if (insideShim()) return nullptr;
  return gMode.load(std::memory_order_acquire);
}

UvmMode* uvmReporting() {
  if (insideShim() || !uvmSelected()) return nullptr;
  if (UvmMode* mode = gMode.load(std::memory_order_acquire)) return mode;
  Shim::instance().active();
  return gMode.load(std::memory_order_acquire);
}

UvmMode::UvmMode(const DriverApi& driver, CUdevice device, uint64_t budgetBytes)
    : driver_(driver), device_(device), budgetBytes_(budgetBytes) {}

void UvmMode::prepare() {
  size_t freeBytes = 0, totalBytes = 0;
  uint64_t reserved = 0;
  if (driver_.cuMemGetInfo_v2(&freeBytes, &totalBytes) == CUDA_SUCCESS && freeBytes > budgetBytes_) {
    const size_t reserve = freeBytes - budgetBytes_;
    if (driver_.cuMemAlloc_v2(&reserve_, reserve) == CUDA_SUCCESS) {
      reserved = reserve;
    } else {
      reserve_ = 0;
      logLine("DELTA_MODE=uvm: could not reserve the %llu MiB of device memory beyond the "
              "budget; managed memory may use more than the budget",
              mib(reserve));
    }
  }
  if (driver_.cuStreamCreate(&prefetchStream_, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
    prefetchStream_ = nullptr;  // allocations then go without a prefetch (counted)
  std::lock_guard lock(mutex_);
  counts_.reserveBytes = reserved;
  logVerbose(1, "uvm: %llu MiB of device memory reserved, %llu MiB left to the job",
             mib(reserved), mib(freeBytes > reserved ? freeBytes - reserved : 0));
}

CUresult UvmMode::allocate(size_t bytes, CUdeviceptr* out) {
  ReentryGuard guard;
  // The real functions fail without a current context; the caller lets them say so.
  CUcontext context = nullptr;
  if (driver_.cuCtxGetCurrent(&context) != CUDA_SUCCESS || context == nullptr)
    return CUDA_ERROR_INVALID_CONTEXT;
  std::call_once(prepared_, [this] { prepare(); });
  CUdeviceptr address = 0;
  if (CUresult result = allocManaged_(&address, bytes, CU_MEM_ATTACH_GLOBAL);
      result != CUDA_SUCCESS) {
    std::lock_guard lock(mutex_);
    counts_.fallbacks++;
    logVerbose(2, "uvm: cuMemAllocManaged(%zu) failed: %s; the real function answers", bytes,
               resultText(driver_, result));
    return result;
  }
  // Hints only: when the driver refuses one, the memory still works, paged on demand. The
  // prefetch goes on a stream of its own so that it orders nothing of the program's.
  CUmemLocation onDevice{};
  onDevice.type = CU_MEM_LOCATION_TYPE_DEVICE;
  onDevice.id = device_;
  bool hinted = advise_(address, bytes, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, onDevice) ==
                CUDA_SUCCESS;
  hinted = prefetchStream_ != nullptr &&
           prefetch_(address, bytes, onDevice, 0, prefetchStream_) == CUDA_SUCCESS && hinted;
  std::lock_guard lock(mutex_);
  live_[address] = bytes;
  counts_.allocations++;
  counts_.liveBytes += bytes;
  counts_.peakLiveBytes = std::max(counts_.peakLiveBytes, counts_.liveBytes);
  if (!hinted) counts_.hintFailures++;
  *out = address;
  return CUDA_SUCCESS;
}

bool UvmMode::free(CUdeviceptr address) {
  size_t bytes = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = live_.find(address);
    if (it == live_.end()) return false;
    bytes = it->second;
    live_.erase(it);
    counts_.liveBytes -= bytes;
  }
  ReentryGuard guard;
  if (driver_.cuMemFree_v2(address) != CUDA_SUCCESS) return false;
  std::lock_guard lock(mutex_);
  counts_.frees++;
  return true;
}

void UvmMode::reportBudget(size_t* free, size_t* total) const {
  // Frameworks size themselves from this: tell them the budget, not the device.
  if (total) *total = budgetBytes_;
  if (free && *free > budgetBytes_) *free = budgetBytes_;
}

UvmMode::Counts UvmMode::counts() {
  std::lock_guard lock(mutex_);
  return counts_;
}

void UvmMode::printSummary() {
  const Counts c = counts();
  logLine("summary: DELTA_MODE=uvm, budget %llu MiB (%llu MiB of device memory reserved), "
          "%llu managed allocations, %llu freed, peak %llu MiB of managed memory live",
          mib(budgetBytes_), mib(c.reserveBytes), (unsigned long long)c.allocations,
          (unsigned long long)c.frees, mib(c.peakLiveBytes));
  if (c.fallbacks > 0 || c.hintFailures > 0)
    logLine("summary: %llu allocations the driver refused as managed memory (made plain), %llu "
            "refused advice or prefetch hints",
            (unsigned long long)c.fallbacks, (unsigned long long)c.hintFailures);
  // The same in one machine-readable line, for scripts and tests.
  logLine("stats mode_uvm=1 budget_bytes=%llu reserve_bytes=%llu managed_allocations=%llu "
          "managed_frees=%llu peak_managed_bytes=%llu fallbacks=%llu hint_failures=%llu",
          (unsigned long long)budgetBytes_, (unsigned long long)c.reserveBytes,
          (unsigned long long)c.allocations, (unsigned long long)c.frees,
          (unsigned long long)c.peakLiveBytes, (unsigned long long)c.fallbacks,
          (unsigned long long)c.hintFailures);
}

}  // namespace delta::shim
