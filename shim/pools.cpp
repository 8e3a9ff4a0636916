#include "shim/pools.h"

#include <cstdlib>
#include <iterator>

#include "shim/log.h"

namespace delta::shim {

CUresult PhysicalPool::acquire(uint64_t bytes, CUmemGenericAllocationHandle* handle) {
  if (takeExact(bytes, handle)) return CUDA_SUCCESS;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUresult result = api_.cuMemCreate(handle, bytes, &prop, 0);
  if (result == CUDA_ERROR_OUT_OF_MEMORY && bytes_ > 0) {
    trim(UINT64_MAX);
    result = api_.cuMemCreate(handle, bytes, &prop, 0);
  }
  return result;
}

bool PhysicalPool::takeExact(uint64_t bytes, CUmemGenericAllocationHandle* handle) {
  auto it = handles_.find(bytes);
  if (it == handles_.end()) return false;
  *handle = it->second;
  handles_.erase(it);
  bytes_ -= bytes;
  return true;
}

void PhysicalPool::release(uint64_t bytes, CUmemGenericAllocationHandle handle) {
  handles_.emplace(bytes, handle);
  bytes_ += bytes;
}

void PhysicalPool::trim(uint64_t bytes) {
  uint64_t released = 0;
  while (!handles_.empty() && released < bytes) {
    auto it = std::prev(handles_.end());
    api_.cuMemRelease(it->second);
    released += it->first;
    bytes_ -= it->first;
    handles_.erase(it);
  }
}

uint64_t HostPool::blockBytes(uint64_t bytes) {
  if (bytes <= 4) return bytes;
  const int top = 63 - __builtin_clzll(bytes - 1);  // bytes - 1 < 2^(top + 1)
  const uint64_t step = uint64_t{1} << (top - 2 > 0 ? top - 2 : 0);
  return (bytes + step - 1) / step * step;
}

void* HostPool::take(uint64_t bytes, bool* pinned) {
  const uint64_t block = blockBytes(bytes);
  auto it = blocks_.find(block);
  if (it != blocks_.end()) {
    void* host = it->second;
    blocks_.erase(it);
    *pinned = true;
    return host;
  }
  if (pinnedBytes_ + block <= limit_) {
    void* host = nullptr;
    if (api_.cuMemHostAlloc(&host, block, 0) == CUDA_SUCCESS) {
      pinnedBytes_ += block;
      *pinned = true;
      return host;
    }
  }
  pageableFallbacks_++;
  DELTA_WARN_ONCE("pinned host memory for evicted buffers is exhausted (DELTA_HOST_LIMIT or the "
                  "system's limit); using pageable memory, copies will be slower");
  *pinned = false;
  return std::malloc(bytes);
}

void HostPool::give(void* host, uint64_t bytes, bool pinned) {
  if (host == nullptr) return;
  if (pinned)
    blocks_.emplace(blockBytes(bytes), host);
  else
    std::free(host);
}

CUevent EventPool::take() {
  if (!events_.empty()) {
    CUevent event = events_.back();
    events_.pop_back();
    return event;
  }
  CUevent event = nullptr;
  if (api_.cuEventCreate(&event, flags_) != CUDA_SUCCESS) return nullptr;
  return event;
}

void EventPool::give(CUevent event) {
  if (event != nullptr) events_.push_back(event);
}

}  // namespace delta::shim
