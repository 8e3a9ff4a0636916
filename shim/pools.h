// What the residency manager keeps for reuse, so that the paths that evict and restore call the
// driver as little as they can: physical memory handles by size, pinned host blocks by size,
// and events. Each is a small class of its own with no lock: the residency lock serialises
// every call (residency.h). tests/shim/pools_test.cpp checks them against a fake driver.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <vector>

#include "shim/real_api.h"

namespace delta::shim {

// Physical device memory (cuMemCreate handles) released by buffers, kept by size for the next
// buffer of that size: with PYTORCH_NO_CUDA_MEMORY_CACHING every tensor is a cudaMalloc/cudaFree
// pair, and cuMemCreate/cuMemRelease are slow. What the pool holds is still the device's memory
// as far as the budget goes (bytes()).
class PhysicalPool {
 public:
  explicit PhysicalPool(const DriverApi& api) : api_(api) {}
  // A handle of `bytes`: from the pool when one of that size is there, else from the driver;
  // when the driver is out of memory and other sizes sit in the pool, they go back to it and
  // the driver is asked once more.
  CUresult acquire(uint64_t bytes, CUmemGenericAllocationHandle* handle);
  // A handle of exactly `bytes` already in the pool (no driver call); false: none.
  bool takeExact(uint64_t bytes, CUmemGenericAllocationHandle* handle);
  void release(uint64_t bytes, CUmemGenericAllocationHandle handle);
  // Gives at least `bytes` back to the device (largest handles first: fewest calls), or all.
  void trim(uint64_t bytes);
  uint64_t bytes() const { return bytes_; }

 private:
  const DriverApi& api_;
  std::multimap<uint64_t, CUmemGenericAllocationHandle> handles_;
  uint64_t bytes_ = 0;
};

// Host memory for evicted buffers' contents: pinned (cuMemHostAlloc) up to a limit, blocks
// kept by size once given back; past the limit or when the system refuses pinned memory,
// pageable memory, which works but makes the copies synchronous (counted, warned about once).
class HostPool {
 public:
  HostPool(const DriverApi& api, uint64_t pinnedLimitBytes) : api_(api), limit_(pinnedLimitBytes) {}
  // At least `bytes` of host memory; give() it back with the same `bytes`.
  void* take(uint64_t bytes, bool* pinned);
  void give(void* host, uint64_t bytes, bool pinned);
  // The size of the pinned block that take(bytes) hands out. Blocks come in classes, four per
  // doubling (at most a quarter more than asked; below 16 MiB every multiple of 2 MiB, the
  // buffers' own granularity, is a class), so that a buffer evicted finds a block that one of
  // another size left: exact sizes made a new block, each a driver call that pins its pages,
  // for most evictions of a network whose buffers differ (DenseNet-121: about 100 blocks,
  // 1.1 GiB, for 3.4 GiB evicted in four iterations).
  static uint64_t blockBytes(uint64_t bytes);
  uint64_t pinnedBytes() const { return pinnedBytes_; }
  uint64_t pageableFallbacks() const { return pageableFallbacks_; }

 private:
  const DriverApi& api_;
  const uint64_t limit_;
  std::multimap<uint64_t, void*> blocks_;
  uint64_t pinnedBytes_ = 0;
  uint64_t pageableFallbacks_ = 0;
};

// Events made once and reused: without timing (ordering only) unless `flags` say otherwise.
class EventPool {
 public:
  explicit EventPool(const DriverApi& api, unsigned flags = CU_EVENT_DISABLE_TIMING)
      : api_(api), flags_(flags) {}
  CUevent take();  // nullptr when the driver cannot make one
  void give(CUevent event);  // nullptr is ignored
  size_t spare() const { return events_.size(); }

 private:
  const DriverApi& api_;
  const unsigned flags_;
  std::vector<CUevent> events_;
};

}  // namespace delta::shim
