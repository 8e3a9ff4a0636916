#include "shim/pools.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include "shim/background_thread.h"
#include "shim/log.h"
#include "shim/reentry_guard.h"

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
  if (result == CUDA_SUCCESS) creates_++;
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

void PhysicalPool::giveBack(CUmemGenericAllocationHandle handle) {
  api_.cuMemRelease(handle);
  releases_++;
}

void PhysicalPool::trim(uint64_t bytes, uint64_t spare) {
  uint64_t released = 0;
  auto spared = spare != 0 ? handles_.find(spare) : handles_.end();
  while (!handles_.empty() && released < bytes) {
    auto it = std::prev(handles_.end());
    if (it == spared && it != handles_.begin()) it = std::prev(it);  // the spared one goes last
    if (it == spared) spared = handles_.end();
    api_.cuMemRelease(it->second);
    releases_++;
    released += it->first;
    bytes_ -= it->first;
    handles_.erase(it);
  }
}

namespace {
// Blocks start on 64 KiB: copies of whole pages, and few slivers between blocks.
constexpr uint64_t kHostAlignment = 64ull << 10;
constexpr uint64_t kChunkGranularity = 2ull << 20;
constexpr uint64_t kSmallestChunk = 32ull << 20;
constexpr uint64_t kLargestChunk = 512ull << 20;

uint64_t roundUp(uint64_t value, uint64_t to) { return (value + to - 1) / to * to; }
}  // namespace

uint64_t HostPool::chunkBytes(uint64_t bytes, uint64_t pinnedBytes) {
  const uint64_t growth = std::clamp(pinnedBytes / 2, kSmallestChunk, kLargestChunk);
  return roundUp(std::max(bytes, growth), kChunkGranularity);
}

void* HostPool::take(uint64_t bytes, bool* pinned) {
  const uint64_t need = roundUp(std::max<uint64_t>(bytes, 1), kHostAlignment);
  if (grower_.ready()) adoptGrown();
  auto fit = freeBySize_.lower_bound({need, 0});
  // No room: the chunk in flight, if any, unless this block alone is pinned sooner (then the
  // chunk still comes, for the blocks after this one).
  bool onlyThis = false;
  if (fit == freeBySize_.end() && grower_.busy()) {
    onlyThis = pinningIsSooner(need);
    if (!onlyThis) {
      adoptGrown();
      fit = freeBySize_.lower_bound({need, 0});
    }
  }
  if (fit == freeBySize_.end() && pinnedBytes_ + need <= limit_) {
    // A new chunk, as large as the growth rule and the limit allow; when the system will not
    // pin that much, just what this buffer needs.
    uint64_t chunk = std::min(onlyThis ? roundUp(need, kChunkGranularity) : chunkBytes(need, pinnedBytes_),
                              limit_ - pinnedBytes_);
    void* host = nullptr;
    CUresult result = pin(&host, chunk);
    if (result != CUDA_SUCCESS && chunk > need) {
      chunk = need;
      result = pin(&host, chunk);
    }
    if (result == CUDA_SUCCESS) {
      addChunk(host, chunk);
      fit = freeBySize_.lower_bound({need, 0});
    }
  }
  if (fit != freeBySize_.end()) {
    *pinned = true;
    void* host = carve(free_.find(fit->second), need);
    growAheadIfLow();
    return host;
  }
  pageableFallbacks_++;
  DELTA_WARN_ONCE("pinned host memory for evicted buffers is exhausted (DELTA_HOST_LIMIT or the "
                  "system's limit); using pageable memory, copies will be slower");
  *pinned = false;
  return std::malloc(bytes);
}

void HostPool::addChunk(void* host, uint64_t bytes) {
  const auto start = reinterpret_cast<uintptr_t>(host);
  chunks_.emplace(start, bytes);
  pinnedBytes_ += bytes;
  addFree(start, bytes);
}

void HostPool::adoptGrown() {
  uint64_t bytes = 0;
  int64_t pinNs = 0;
  void* host = grower_.wait(&bytes, &pinNs);
  if (host == nullptr) {
    growthRefused_ = true;  // the system's limit, most likely: asking again would fail again
    return;
  }
  if (pinNs > 0) {
    timedPinBytes_ += bytes;
    timedPinNs_ += pinNs;
  }
  addChunk(host, bytes);
  chunksAhead_++;
}

CUresult HostPool::pin(void** host, uint64_t bytes) {
  const int64_t start = clock_();
  const CUresult result = api_.cuMemHostAlloc(host, bytes, 0);
  const int64_t took = clock_() - start;
  if (result == CUDA_SUCCESS && took > 0) {
    timedPinBytes_ += bytes;
    timedPinNs_ += took;
  }
  return result;
}

bool HostPool::pinningIsSooner(uint64_t bytes) const {
  // Unmeasured, or pinning too quick for the rate to say anything (a wait then costs little
  // anyway): the chunk in flight, as the one sure to come.
  constexpr int64_t kMeasurablePinNs = 1000000;
  if (timedPinBytes_ == 0 || timedPinNs_ < kMeasurablePinNs) return false;
  const double nsPerByte = static_cast<double>(timedPinNs_) / static_cast<double>(timedPinBytes_);
  const int64_t started = grower_.pinStartNs();
  const double elapsed = started > 0 ? static_cast<double>(clock_() - started) : 0.0;
  const double chunkLeft = static_cast<double>(grower_.inFlightBytes()) * nsPerByte - elapsed;
  return static_cast<double>(bytes) * nsPerByte < chunkLeft;
}

void HostPool::growAheadIfLow() {
  if (growthRefused_ || grower_.busy()) return;
  if (freeBytes_ >= std::max(kSmallestChunk, pinnedBytes_ / 8)) return;
  if (pinnedBytes_ >= limit_) return;
  const uint64_t bytes = std::min(chunkBytes(0, pinnedBytes_), limit_ - pinnedBytes_);
  CUcontext context = nullptr;
  if (api_.cuCtxGetCurrent == nullptr || api_.cuCtxSetCurrent == nullptr ||
      api_.cuCtxGetCurrent(&context) != CUDA_SUCCESS || context == nullptr)
    return;
  grower_.request(context, bytes);
}

PinnedGrower::~PinnedGrower() {
  {
    std::unique_lock lock(mutex_);
    stop_ = true;
    wake_.notify_all();
  }
  if (started_) pthread_join(thread_, nullptr);
  if (result_ != nullptr) api_.cuMemFreeHost(result_);
}

bool PinnedGrower::request(CUcontext context, uint64_t bytes) {
  std::lock_guard lock(mutex_);
  if (busy_) return false;
  if (!started_) {
    if (!startBackgroundThread(&thread_, &PinnedGrower::threadMain, this)) return false;
    started_ = true;
  }
  context_ = context;
  asked_ = bytes;
  inFlightBytes_ = bytes;
  pinStartNs_.store(0, std::memory_order_release);
  busy_ = true;
  wake_.notify_all();  // the one condition serves both sides
  return true;
}

void* PinnedGrower::wait(uint64_t* bytes, int64_t* pinNs) {
  std::unique_lock lock(mutex_);
  wake_.wait(lock, [this] { return ready_.load(std::memory_order_relaxed); });
  ready_.store(false, std::memory_order_relaxed);
  busy_ = false;
  void* host = result_;
  *bytes = resultBytes_;
  *pinNs = resultNs_;
  result_ = nullptr;
  return host;
}

void* PinnedGrower::threadMain(void* self) {
  becomeBackgroundThread("delta-pinning");
  static_cast<PinnedGrower*>(self)->run();
  return nullptr;
}

void PinnedGrower::run() {
  ReentryGuard guard;
  for (;;) {
    CUcontext context = nullptr;
    uint64_t bytes = 0;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] { return asked_ != 0 || stop_; });
      if (stop_) return;
      context = context_;
      bytes = asked_;
      asked_ = 0;
    }
    void* host = nullptr;
    const int64_t start = clock_();
    pinStartNs_.store(start, std::memory_order_release);
    if (api_.cuCtxSetCurrent(context) != CUDA_SUCCESS ||
        api_.cuMemHostAlloc(&host, bytes, 0) != CUDA_SUCCESS)
      host = nullptr;
    const int64_t took = clock_() - start;
    std::lock_guard lock(mutex_);
    result_ = host;
    resultBytes_ = host != nullptr ? bytes : 0;
    resultNs_ = host != nullptr ? took : 0;
    ready_.store(true, std::memory_order_release);
    wake_.notify_all();
  }
}

void* HostPool::carve(std::map<uintptr_t, uint64_t>::iterator range, uint64_t bytes) {
  const uintptr_t start = range->first;
  const uint64_t rangeBytes = range->second;
  freeBySize_.erase({rangeBytes, start});
  free_.erase(range);
  freeBytes_ -= rangeBytes;
  if (rangeBytes > bytes) addFree(start + bytes, rangeBytes - bytes);
  taken_.emplace(start, bytes);
  return reinterpret_cast<void*>(start);
}

bool HostPool::sameChunk(uintptr_t a, uintptr_t b) const {
  auto chunk = chunks_.upper_bound(a);
  if (chunk == chunks_.begin()) return false;
  --chunk;
  return b >= chunk->first && b - chunk->first < chunk->second;
}

// Merges with the free neighbours in the same chunk: two chunks that happen to lie side by side
// are two pinned allocations, and a copy must not span them.
void HostPool::addFree(uintptr_t start, uint64_t bytes) {
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + bytes && sameChunk(start, next->first)) {
    bytes += next->second;
    freeBySize_.erase({next->second, next->first});
    freeBytes_ -= next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second == start && sameChunk(previous->first, start)) {
      freeBySize_.erase({previous->second, previous->first});
      freeBytes_ -= previous->second;
      start = previous->first;
      bytes += previous->second;
      free_.erase(previous);
    }
  }
  free_.emplace(start, bytes);
  freeBySize_.emplace(bytes, start);
  freeBytes_ += bytes;
}

void HostPool::give(void* host, bool pinned) {
  if (host == nullptr) return;
  if (!pinned) {
    std::free(host);
    return;
  }
  auto block = taken_.find(reinterpret_cast<uintptr_t>(host));
  if (block == taken_.end()) return;  // not ours: nothing to give back
  const uint64_t bytes = block->second;
  taken_.erase(block);
  addFree(reinterpret_cast<uintptr_t>(host), bytes);
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
