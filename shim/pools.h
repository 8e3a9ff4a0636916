// What the residency manager keeps for reuse, so that the paths that evict and restore call the
// driver as little as they can: physical memory handles by size, pinned host memory in chunks,
// and events. Each is a small class of its own with no lock: the residency lock serialises
// every call (residency.h); only PinnedGrower, which pins on a thread of its own, has one, for
// that thread. tests/shim/pools_test.cpp checks them against a fake driver.
#pragma once

#include <cuda.h>
#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "shim/clock.h"
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
  // Back to the device at once, not pooled (memory the budget never counted).
  void giveBack(CUmemGenericAllocationHandle handle);
  // Gives at least `bytes` back to the device (largest handles first: fewest calls), or all;
  // one handle of `spare` bytes goes last (the one the caller is about to take).
  void trim(uint64_t bytes, uint64_t spare = 0);
  bool holds(uint64_t bytes) const { return handles_.contains(bytes); }
  uint64_t bytes() const { return bytes_; }
  uint64_t creates() const { return creates_; }  // cuMemCreate calls that succeeded
  uint64_t releases() const { return releases_; }

 private:
  const DriverApi& api_;
  uint64_t creates_ = 0;
  uint64_t releases_ = 0;
  std::multimap<uint64_t, CUmemGenericAllocationHandle> handles_;
  uint64_t bytes_ = 0;
};

// Monotonic nanoseconds (nowNs, or a test's fake clock); pins are timed by it.
using PinClock = int64_t (*)();

// Pins one chunk of host memory at a time on a background thread, for HostPool to grow ahead of
// need: pinning is slow (the driver locks and maps each page: tens of milliseconds for a large
// chunk on a GPU machine, about a second for 384 MiB on this virtual machine), and done on the
// eviction path it stops the host from feeding the GPU exactly when memory is short. The thread
// starts at the first request, with every signal blocked and a lower priority, like the planner
// (planner_thread.h); it runs under ReentryGuard (its CUPTI callbacks pass) and takes no lock of
// the shim's. Its owner (HostPool, under the residency lock) polls ready() or wait()s; the
// destructor waits for a chunk in flight and gives back one never taken.
class PinnedGrower {
 public:
  // `clock`: what pins are timed by (a test's fake clock; nullptr: nowNs).
  PinnedGrower(const DriverApi& api, PinClock clock) : api_(api), clock_(clock ? clock : &nowNs) {}
  PinnedGrower(const PinnedGrower&) = delete;
  PinnedGrower& operator=(const PinnedGrower&) = delete;
  ~PinnedGrower();

  // Pins `bytes` in `context` on the thread. False when one is in flight or no thread starts.
  bool request(CUcontext context, uint64_t bytes);
  bool busy() const { return busy_; }
  // The chunk is pinned (or refused): one acquire load.
  bool ready() const { return ready_.load(std::memory_order_acquire); }
  // Waits for the chunk in flight; nullptr when the driver refused it. *bytes: its size;
  // *pinNs: how long the driver took to pin it.
  void* wait(uint64_t* bytes, int64_t* pinNs);
  // The chunk in flight: its size, and when the thread began pinning it (0: not yet).
  uint64_t inFlightBytes() const { return busy_ ? inFlightBytes_ : 0; }
  int64_t pinStartNs() const { return pinStartNs_.load(std::memory_order_acquire); }

 private:
  static void* threadMain(void* self);
  void run();

  const DriverApi& api_;
  const PinClock clock_;
  std::mutex mutex_;
  std::condition_variable wake_;
  CUcontext context_ = nullptr;
  uint64_t asked_ = 0;   // bytes requested, not yet picked up by the thread
  void* result_ = nullptr;
  uint64_t resultBytes_ = 0;
  int64_t resultNs_ = 0;
  uint64_t inFlightBytes_ = 0;  // the owner's view
  std::atomic<int64_t> pinStartNs_{0};
  bool busy_ = false;    // requested, not yet waited for (the owner's view)
  bool stop_ = false;
  std::atomic<bool> ready_{false};
  pthread_t thread_{};
  bool started_ = false;
};

// Host memory for evicted buffers' contents, carved from a few large pinned chunks
// (cuMemHostAlloc) up to a limit; past the limit or when the system refuses pinned memory,
// pageable memory, which works but makes the copies synchronous (counted, warned about once).
//
// Why chunks, not a block per buffer: pinning costs per page (on a GPU machine the driver locks
// and maps each page; here cudasim writes each one, and a virtual machine can make that ten
// times slower than the copy), and blocks kept by size grew with every size class's own peak,
// long after the first iterations: DenseNet-121 pinned 1.45 GiB in about 140 calls, a third of
// them in the measured iterations, for at most 1.05 GiB evicted at once, and the host stopped
// feeding the GPU for each. Chunks grow by half of what is pinned (at least 32 MiB, at most
// 512 MiB), so a job pins its peak in a dozen calls; best fit with coalescing keeps what it pins
// near the most it holds at once. The next chunk is pinned on PinnedGrower's thread as soon as
// less than an eighth of what is pinned (at least 32 MiB) is left free, so that an eviction
// rarely waits for the driver. When one finds no room while a chunk is in flight, it waits for
// that chunk, unless pinning just its own block would be sooner by the pinning rate measured so
// far: a wait for a fresh 396 MiB chunk held DenseNet-121's host half a second in one iteration
// (30 %/50 GB/s on cudasim, the iteration 2.2 times its length) where its 15 MiB block alone
// takes 20-35 ms.
// With no chunk in flight it pins a chunk of its own. A driver table without contexts (a
// test's fake) pins on demand only.
class HostPool {
 public:
  // `clock`: what pins are timed by (a test's fake clock; nullptr: nowNs).
  HostPool(const DriverApi& api, uint64_t pinnedLimitBytes, PinClock clock = nullptr)
      : api_(api), limit_(pinnedLimitBytes), clock_(clock ? clock : &nowNs), grower_(api, clock_) {}
  // At least `bytes` of host memory; give() it back. *pinned says which kind it is.
  void* take(uint64_t bytes, bool* pinned);
  void give(void* host, bool pinned);
  // How much the next chunk pins when `bytes` do not fit in what is free: half of what is pinned
  // already, within [32 MiB, 512 MiB], at least `bytes`, in whole 2 MiB.
  static uint64_t chunkBytes(uint64_t bytes, uint64_t pinnedBytes);
  uint64_t pinnedBytes() const { return pinnedBytes_; }
  uint64_t pinnedChunks() const { return chunks_.size(); }
  uint64_t chunksPinnedAhead() const { return chunksAhead_; }
  uint64_t freePinnedBytes() const { return freeBytes_; }
  uint64_t pageableFallbacks() const { return pageableFallbacks_; }

 private:
  void* carve(std::map<uintptr_t, uint64_t>::iterator range, uint64_t bytes);
  void addFree(uintptr_t start, uint64_t bytes);
  bool sameChunk(uintptr_t a, uintptr_t b) const;
  void addChunk(void* host, uint64_t bytes);
  void adoptGrown();
  // cuMemHostAlloc, timed for the pinning rate.
  CUresult pin(void** host, uint64_t bytes);
  // Whether pinning `bytes` now would end before the chunk in flight, by the rate measured.
  bool pinningIsSooner(uint64_t bytes) const;
  void growAheadIfLow();

  const DriverApi& api_;
  const uint64_t limit_;
  const PinClock clock_;
  std::map<uintptr_t, uint64_t> chunks_;                // start -> bytes, as pinned
  std::map<uintptr_t, uint64_t> free_;                  // start -> bytes, address order
  std::set<std::pair<uint64_t, uintptr_t>> freeBySize_; // (bytes, start), for best fit
  std::unordered_map<uintptr_t, uint64_t> taken_;       // start -> bytes, handed out
  uint64_t pinnedBytes_ = 0;
  uint64_t freeBytes_ = 0;
  uint64_t chunksAhead_ = 0;
  uint64_t pageableFallbacks_ = 0;
  // Every pin timed so far (on demand and ahead): the rate the driver pins at.
  uint64_t timedPinBytes_ = 0;
  int64_t timedPinNs_ = 0;
  bool growthRefused_ = false;  // the driver refused a chunk ahead: only on demand from then on
  PinnedGrower grower_;         // last: its destructor may still hand a chunk back
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
