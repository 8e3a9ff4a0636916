// DELTA_MODE=uvm: the Unified Memory baseline, the naive transparent approach that DELTA is
// compared against. Every allocation the shim would manage (cudaMalloc / cuMemAlloc of at
// least DELTA_MIN_BYTES) becomes cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL), advised to prefer
// the device and prefetched to it; the driver then pages it between device and host on
// demand. There is no residency manager and no CUPTI subscription: everything else passes
// through, and DELTA_POLICY, DELTA_PREFETCH, DELTA_STRICT, DELTA_HOST_LIMIT and DELTA_TRACE
// have no effect.
//
// The budget: managed memory by itself can use the whole device, so on a device larger than
// the budget there would be no oversubscription to measure. At the first managed allocation
// the mode therefore takes, with one plain cuMemAlloc that nothing ever touches, the device
// memory that is free beyond the budget (the "reserve"). The driver cannot evict plain
// allocations, so from then on the job's managed pages and its unmanaged allocations share
// `budget` bytes of device memory, as on a device of that size. cudaMemGetInfo and
// cuMemGetInfo report the budget as the total, as in the vmm mode.
//
// Costs: an allocation is cuMemAllocManaged + cuMemAdvise + an asynchronous prefetch on a
// stream of the mode's own, plus one lock and a hash-table insert; a free is a lookup and
// cuMemFree. Nothing is added to launches.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "shim/real_api.h"

namespace delta::shim {

class UvmMode;

// Starts the mode; Shim::activate calls it once the device and the budget are known. False
// (nothing started) when the driver lacks managed memory or the device cannot oversubscribe
// it (no concurrent managed access): the shim then passes everything through.
bool startUvmMode(const DriverApi& driver, CUdevice device, uint64_t budgetBytes);

// For an allocation of `bytes`: the mode, when DELTA_MODE=uvm is in force and the
// allocation is one it manages (activating the shim if need be); nullptr otherwise.
UvmMode* uvmManaging(size_t bytes);
// For frees: the mode if it has started (never activates); nullptr otherwise.
UvmMode* uvmStarted();
// For cudaMemGetInfo / cuMemGetInfo: the mode, activating the shim if need be.
UvmMode* uvmReporting();

class UvmMode {
 public:
  UvmMode(const DriverApi& driver, CUdevice device, uint64_t budgetBytes);

  // A managed allocation, advised and prefetched to the device. On failure nothing is
  // allocated and the driver's error is returned: the caller then lets the real function
  // answer, so the program sees what it would have seen without the shim.
  CUresult allocate(size_t bytes, CUdeviceptr* out);
  // True when `address` is one of the mode's allocations and cuMemFree freed it. False when
  // it is not ours, or when cuMemFree failed (the mode forgets it: the real function answers).
  bool free(CUdeviceptr address);
  // After the real call has filled them: the budget as the total, free memory at most that.
  void reportBudget(size_t* free, size_t* total) const;

  // At exit, with DELTA_VERBOSE >= 1: one line for people, one "stats k=v ..." line for
  // scripts and tests.
  void printSummary();

  struct Counts {
    uint64_t allocations = 0;
    uint64_t frees = 0;
    uint64_t liveBytes = 0;
    uint64_t peakLiveBytes = 0;
    uint64_t fallbacks = 0;        // allocations the driver refused, left to the real function
    uint64_t hintFailures = 0;     // advice or prefetch calls that failed (the memory is fine)
    uint64_t reserveBytes = 0;     // device memory taken to hold the job to the budget
  };
  Counts counts();

 private:
  // The first time a context is current: takes the reserve and creates the prefetch stream.
  void prepare();

  // The driver's managed-memory functions, fetched by startUvmMode (current signatures).
  decltype(&::cuMemAllocManaged) allocManaged_ = nullptr;
  decltype(&::cuMemAdvise) advise_ = nullptr;
  decltype(&::cuMemPrefetchAsync) prefetch_ = nullptr;
  friend bool startUvmMode(const DriverApi&, CUdevice, uint64_t);

  const DriverApi& driver_;
  const CUdevice device_;
  const uint64_t budgetBytes_;
  std::once_flag prepared_;
  CUstream prefetchStream_ = nullptr;  // nullptr until prepared (or if it could not be made)
  CUdeviceptr reserve_ = 0;            // never freed: it holds the job to the budget

  std::mutex mutex_;  // guards what follows
  std::unordered_map<CUdeviceptr, size_t> live_;
  Counts counts_;
};

}  // namespace delta::shim
