// The stream-ordered allocator of the simulated GPU: memory pools, cuMemAllocAsync and
// cuMemFreeAsync.
//
// A pool holds chunks of device memory (DeviceMemory::allocateChunk, whole granules) and hands
// out pieces of them. What a program frees stays in the pool, mapped, until a synchronisation
// point finds the pool holding more than its release threshold, or cuMemPoolTrimTo asks: only
// then is a chunk with nothing left in it unmapped, so a kernel that touches memory freed and
// released faults as it would on a GPU, while one that touches memory freed but kept does not.
//
// A free is stream ordered: it becomes a marker in its stream, and its memory may serve a new
// allocation only where that cannot overlap the work before the free:
// - on the same stream, at once (stream order covers it);
// - when the marker has been reached (CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC);
// - on another stream, made to wait for the marker (REUSE_ALLOW_INTERNAL_DEPENDENCIES);
// - once a synchronisation point has seen the marker reached, by anyone.
// Simplified: cudasim does not track which event or legacy-stream dependencies a stream has, so
// REUSE_FOLLOW_EVENT_DEPENDENCIES never allows a reuse by itself (where the real driver would
// reuse, cudasim may take new memory instead: never unsafe, sometimes more memory).
//
// One mutex serves all pools. It is taken before DeviceMemory's and StreamEngine's (never
// after), and nothing waits while holding it.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "device_memory.h"
#include "range_allocator.h"
#include "stream_engine.h"

namespace cudasim {

// Pool allocations are aligned (and sized) to this, as the real allocator's are at least.
inline constexpr uint64_t kPoolAlignment = 512;

class MemoryPools {
 public:
  MemoryPools(DeviceMemory& memory, StreamEngine& streams);

  CUmemoryPool defaultPool() const { return defaultPool_; }
  CUmemoryPool currentPool();
  // CUDA_ERROR_INVALID_VALUE for a pool that is not (or no longer) one.
  CUresult setCurrentPool(CUmemoryPool pool);

  CUresult create(const CUmemPoolProps& props, CUmemoryPool* out);
  // The default pool cannot be destroyed. A pool with allocations outstanding goes once they
  // are freed; its handle is invalid at once.
  CUresult destroy(CUmemoryPool pool);
  CUresult setAttribute(CUmemoryPool pool, CUmemPool_attribute attribute, const void* value);
  CUresult getAttribute(CUmemoryPool pool, CUmemPool_attribute attribute, void* value);
  CUresult trimTo(CUmemoryPool pool, uint64_t minBytesToKeep);
  bool isPool(CUmemoryPool pool);

  // cuMemAllocFromPoolAsync: `bytes` from `pool`, usable by work queued on `stream` from now.
  CUresult allocate(CUmemoryPool pool, uint64_t bytes, const std::shared_ptr<Stream>& stream,
                    CUdeviceptr* out);
  // cuMemFreeAsync: queues the free on `stream`. CUDA_ERROR_INVALID_VALUE for a pointer that
  // is not a live pool allocation (never one, or freed already).
  CUresult freeAsync(CUdeviceptr address, const std::shared_ptr<Stream>& stream);
  // cuMemFree of pool memory: free now, with no synchronisation (the caller has made sure no
  // work uses it, as documented). CUDA_ERROR_NOT_FOUND when it is not pool memory.
  CUresult freeNow(CUdeviceptr address);
  // The pool the live allocation at `address` came from, or nullptr.
  CUmemoryPool poolOf(CUdeviceptr address);

  // A stream, event or context synchronisation has happened: frees it has seen complete become
  // free memory of their pools, and pools above their release threshold give chunks back.
  void synchronized();

 private:
  struct Chunk {
    uint64_t bytes;
    RangeAllocator space;   // what no allocation and no pending free holds
    uint64_t taken = 0;     // bytes of allocations and pending frees in it
  };
  struct PendingFree {
    uint64_t address;
    uint64_t bytes;
    std::shared_ptr<Stream> stream;
    uint64_t position;      // of the free's marker in `stream`
  };
  struct Pool {
    CUmemPoolProps props{};
    bool destroyed = false;
    bool followEventDependencies = true;
    bool allowOpportunistic = true;
    bool allowInternalDependencies = true;
    uint64_t releaseThreshold = 0;
    uint64_t reserved = 0, reservedHigh = 0, used = 0, usedHigh = 0;
    uint64_t allocations = 0;
    std::map<uint64_t, Chunk> chunks;   // by address
    std::vector<PendingFree> pending;   // in the order of the frees
  };
  struct Allocation {
    Pool* pool;
    uint64_t bytes;  // rounded to kPoolAlignment
  };

  // nullptr for a handle that is not a live pool (mutex_ held).
  Pool* find(CUmemoryPool handle);
  Chunk& chunkOf(Pool& pool, uint64_t address);
  // Takes `bytes` from what the pool holds, waiting on `stream` for a free where needed;
  // 0 when nothing fits.
  uint64_t reuse(Pool& pool, uint64_t bytes, const std::shared_ptr<Stream>& stream);
  // Pending frees whose markers have been reached become free space.
  void retire(Pool& pool);
  // Unmaps empty chunks while the pool keeps at least `keep` bytes.
  void release(Pool& pool, uint64_t keep);
  // Takes the live allocation at `address` out of the books (its pool's use, the device's
  // sub-allocations); false when there is none (mutex_ held).
  bool forget(CUdeviceptr address, Allocation* out);
  // Frees a destroyed pool once nothing of it is outstanding; true when it went.
  bool collect(Pool* pool);

  DeviceMemory& memory_;
  StreamEngine& streams_;
  CUmemoryPool defaultPool_ = nullptr;

  std::mutex mutex_;
  CUmemoryPool current_ = nullptr;
  std::unordered_map<CUmemoryPool, std::unique_ptr<Pool>> pools_;  // the handle is the Pool*
  std::map<uint64_t, Allocation> allocations_;                      // live ones, all pools
};

}  // namespace cudasim
