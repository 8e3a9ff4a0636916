#include "memory_pool.h"

#include <algorithm>
#include <cstring>
#include <iterator>

namespace cudasim {
namespace {

uint64_t roundUp(uint64_t value, uint64_t to) { return (value + to - 1) / to * to; }

CUmemPoolProps defaultProps() {
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  return props;
}

}  // namespace

MemoryPools::MemoryPools(DeviceMemory& memory, StreamEngine& streams)
    : memory_(memory), streams_(streams) {
  auto pool = std::make_unique<Pool>();
  pool->props = defaultProps();
  defaultPool_ = reinterpret_cast<CUmemoryPool>(pool.get());
  current_ = defaultPool_;
  pools_.emplace(defaultPool_, std::move(pool));
}

MemoryPools::Pool* MemoryPools::find(CUmemoryPool handle) {
  auto it = pools_.find(handle);
  return it == pools_.end() || it->second->destroyed ? nullptr : it->second.get();
}

bool MemoryPools::isPool(CUmemoryPool pool) {
  std::lock_guard lock(mutex_);
  return find(pool) != nullptr;
}

CUmemoryPool MemoryPools::currentPool() {
  std::lock_guard lock(mutex_);
  return current_;
}

CUresult MemoryPools::setCurrentPool(CUmemoryPool pool) {
  std::lock_guard lock(mutex_);
  if (find(pool) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  current_ = pool;
  return CUDA_SUCCESS;
}

CUresult MemoryPools::create(const CUmemPoolProps& props, CUmemoryPool* out) {
  auto pool = std::make_unique<Pool>();
  pool->props = props;
  auto handle = reinterpret_cast<CUmemoryPool>(pool.get());
  std::lock_guard lock(mutex_);
  pools_.emplace(handle, std::move(pool));
  *out = handle;
  return CUDA_SUCCESS;
}

CUresult MemoryPools::destroy(CUmemoryPool handle) {
  std::lock_guard lock(mutex_);
  Pool* pool = find(handle);
  if (pool == nullptr || handle == defaultPool_) return CUDA_ERROR_INVALID_VALUE;
  pool->destroyed = true;
  if (current_ == handle) current_ = defaultPool_;
  collect(pool);
  return CUDA_SUCCESS;
}

CUresult MemoryPools::setAttribute(CUmemoryPool handle, CUmemPool_attribute attribute,
                                   const void* value) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(mutex_);
  Pool* pool = find(handle);
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int flag = 0;
  cuuint64_t bytes = 0;
  switch (attribute) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      std::memcpy(&flag, value, sizeof flag);
      pool->followEventDependencies = flag != 0;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
      std::memcpy(&flag, value, sizeof flag);
      pool->allowOpportunistic = flag != 0;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      std::memcpy(&flag, value, sizeof flag);
      pool->allowInternalDependencies = flag != 0;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      // Takes effect at the next synchronisation point, as documented.
      std::memcpy(&bytes, value, sizeof bytes);
      pool->releaseThreshold = bytes;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      // Watermarks can only be reset (to zero, which leaves them at the current value).
      std::memcpy(&bytes, value, sizeof bytes);
      if (bytes != 0) return CUDA_ERROR_INVALID_VALUE;
      if (attribute == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
        pool->reservedHigh = pool->reserved;
      else
        pool->usedHigh = pool->used;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;  // the current values are read-only
  }
}

CUresult MemoryPools::getAttribute(CUmemoryPool handle, CUmemPool_attribute attribute,
                                   void* value) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(mutex_);
  Pool* pool = find(handle);
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto flag = [value](bool on) {
    const int v = on ? 1 : 0;
    std::memcpy(value, &v, sizeof v);
    return CUDA_SUCCESS;
  };
  auto bytes = [value](uint64_t b) {
    const cuuint64_t v = b;
    std::memcpy(value, &v, sizeof v);
    return CUDA_SUCCESS;
  };
  switch (attribute) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: return flag(pool->followEventDependencies);
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: return flag(pool->allowOpportunistic);
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      return flag(pool->allowInternalDependencies);
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: return bytes(pool->releaseThreshold);
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: return bytes(pool->reserved);
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: return bytes(pool->reservedHigh);
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: return bytes(pool->used);
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: return bytes(pool->usedHigh);
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult MemoryPools::trimTo(CUmemoryPool handle, uint64_t minBytesToKeep) {
  std::lock_guard lock(mutex_);
  Pool* pool = find(handle);
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Frees whose completion the host has not observed may count as outstanding (documented);
  // those already complete are given back too.
  retire(*pool);
  release(*pool, minBytesToKeep);
  return CUDA_SUCCESS;
}

MemoryPools::Chunk& MemoryPools::chunkOf(Pool& pool, uint64_t address) {
  return std::prev(pool.chunks.upper_bound(address))->second;
}

uint64_t MemoryPools::reuse(Pool& pool, uint64_t bytes, const std::shared_ptr<Stream>& stream) {
  for (auto& [base, chunk] : pool.chunks) {
    if (auto address = chunk.space.allocate(bytes, kPoolAlignment)) {
      chunk.taken += bytes;
      return *address;
    }
  }
  // Pending frees, safest first: the same stream, then frees already complete, then frees the
  // stream is made to wait for.
  enum class Way { kSameStream, kComplete, kWait };
  for (Way way : {Way::kSameStream, Way::kComplete, Way::kWait}) {
    if (way == Way::kComplete && !pool.allowOpportunistic) continue;
    if (way == Way::kWait && !pool.allowInternalDependencies) continue;
    for (auto it = pool.pending.begin(); it != pool.pending.end(); ++it) {
      if (it->bytes < bytes) continue;
      if (way == Way::kSameStream && it->stream != stream) continue;
      if (way == Way::kComplete && !it->stream->reached(it->position)) continue;
      if (way == Way::kWait && it->stream != stream)
        stream->submit(WorkItem{{}, "cuMemAllocAsync", nullptr, it->stream, it->position});
      const uint64_t address = it->address;
      it->address += bytes;
      it->bytes -= bytes;
      if (it->bytes == 0) pool.pending.erase(it);
      return address;
    }
  }
  return 0;
}

CUresult MemoryPools::allocate(CUmemoryPool handle, uint64_t requested,
                               const std::shared_ptr<Stream>& stream, CUdeviceptr* out) {
  if (requested == 0) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t bytes = roundUp(requested, kPoolAlignment);
  std::lock_guard lock(mutex_);
  Pool* pool = find(handle);
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t address = reuse(*pool, bytes, stream);
  if (address == 0) {
    // The pool grows by whole granules. A full device fails the allocation: the driver does
    // not give back other pools' free memory, nor wait for pending frees, by itself.
    const uint64_t chunkBytes = roundUp(bytes, kGranularity);
    if (pool->props.maxSize != 0 && pool->reserved + chunkBytes > pool->props.maxSize)
      return CUDA_ERROR_OUT_OF_MEMORY;
    CUdeviceptr base = 0;
    if (CUresult r = memory_.allocateChunk(chunkBytes, &base)) return r;
    auto& chunk = pool->chunks.emplace(base, Chunk{chunkBytes, RangeAllocator(base, chunkBytes)})
                      .first->second;
    pool->reserved += chunkBytes;
    pool->reservedHigh = std::max(pool->reservedHigh, pool->reserved);
    address = *chunk.space.allocate(bytes, kPoolAlignment);
    chunk.taken += bytes;
  }
  pool->used += bytes;
  pool->usedHigh = std::max(pool->usedHigh, pool->used);
  pool->allocations++;
  allocations_[address] = Allocation{pool, bytes};
  memory_.addSubAllocation(address, requested);
  *out = address;
  return CUDA_SUCCESS;
}

CUresult MemoryPools::freeAsync(CUdeviceptr address, const std::shared_ptr<Stream>& stream) {
  std::lock_guard lock(mutex_);
  Allocation allocation;
  if (!forget(address, &allocation)) return CUDA_ERROR_INVALID_VALUE;
  Pool& pool = *allocation.pool;
  // The marker: the point in the stream after which nothing queued before the free runs.
  WorkItem marker;
  marker.call = "cuMemFreeAsync";
  marker.instant = true;
  marker.run = [] {};
  const uint64_t position = streams_.submit(stream, std::move(marker));
  pool.pending.push_back(PendingFree{address, allocation.bytes, stream, position});
  return CUDA_SUCCESS;
}

CUresult MemoryPools::freeNow(CUdeviceptr address) {
  std::lock_guard lock(mutex_);
  Allocation allocation;
  if (!forget(address, &allocation)) return CUDA_ERROR_NOT_FOUND;
  Pool& pool = *allocation.pool;
  Chunk& chunk = chunkOf(pool, address);
  chunk.space.release(address, allocation.bytes);
  chunk.taken -= allocation.bytes;
  collect(&pool);
  return CUDA_SUCCESS;
}

bool MemoryPools::forget(CUdeviceptr address, Allocation* out) {
  auto it = allocations_.find(address);
  if (it == allocations_.end()) return false;
  *out = it->second;
  allocations_.erase(it);
  memory_.removeSubAllocation(address);
  out->pool->used -= out->bytes;
  out->pool->allocations--;
  return true;
}

CUmemoryPool MemoryPools::poolOf(CUdeviceptr address) {
  std::lock_guard lock(mutex_);
  auto it = allocations_.upper_bound(address);
  if (it == allocations_.begin()) return nullptr;
  --it;
  if (address - it->first >= it->second.bytes) return nullptr;
  return reinterpret_cast<CUmemoryPool>(it->second.pool);
}

void MemoryPools::retire(Pool& pool) {
  std::erase_if(pool.pending, [&](const PendingFree& free) {
    if (!free.stream->reached(free.position)) return false;
    Chunk& chunk = chunkOf(pool, free.address);
    chunk.space.release(free.address, free.bytes);
    chunk.taken -= free.bytes;
    return true;
  });
}

void MemoryPools::release(Pool& pool, uint64_t keep) {
  for (auto it = pool.chunks.begin(); it != pool.chunks.end();) {
    if (it->second.taken != 0 || pool.reserved - it->second.bytes < keep) {
      ++it;
      continue;
    }
    memory_.freeChunk(it->first);
    pool.reserved -= it->second.bytes;
    it = pool.chunks.erase(it);
  }
}

bool MemoryPools::collect(Pool* pool) {
  if (!pool->destroyed || pool->allocations != 0) return false;
  retire(*pool);
  if (!pool->pending.empty()) return false;
  release(*pool, 0);
  pools_.erase(reinterpret_cast<CUmemoryPool>(pool));
  return true;
}

void MemoryPools::synchronized() {
  std::lock_guard lock(mutex_);
  for (auto it = pools_.begin(); it != pools_.end();) {
    Pool* pool = (it++)->second.get();
    if (collect(pool)) continue;
    retire(*pool);
    release(*pool, pool->releaseThreshold);
  }
}

}  // namespace cudasim
