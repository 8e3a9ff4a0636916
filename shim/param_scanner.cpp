#include "shim/param_scanner.h"

#include <atomic>

namespace delta::shim {

namespace {
std::atomic<uint64_t> gCacheGenerations{0};

struct CachedLayout {
  uint64_t generation;
  CUfunction function;
  const ParamLayout* layout;
};
// Per thread: zero-initialised, no constructor or destructor (nothing to run at thread exit).
constexpr size_t kThreadSlots = 64;
thread_local CachedLayout tLayouts[kThreadSlots];
}  // namespace

ParamLayoutCache::ParamLayoutCache() : generation_(gCacheGenerations.fetch_add(1) + 1) {}

const ParamLayout& ParamLayoutCache::layout(const DriverApi& api, CUfunction function) {
  CachedLayout& slot = tLayouts[(reinterpret_cast<uintptr_t>(function) >> 4) % kThreadSlots];
  if (slot.generation == generation_ && slot.function == function) [[likely]] return *slot.layout;
  const ParamLayout& found = lookupLocked(api, function);
  slot = CachedLayout{generation_, function, &found};
  return found;
}

const ParamLayout& ParamLayoutCache::lookupLocked(const DriverApi& api, CUfunction function) {
  std::lock_guard lock(mutex_);
  auto [it, inserted] = layouts_.try_emplace(function);
  if (!inserted) return it->second;
  ParamLayout& layout = it->second;
  // Parameters are numbered until the driver says CUDA_ERROR_INVALID_VALUE; any other
  // error means the driver cannot describe this function.
  for (size_t index = 0;; ++index) {
    size_t offset = 0, size = 0;
    CUresult result = api.cuFuncGetParamInfo(function, index, &offset, &size);
    if (result == CUDA_ERROR_INVALID_VALUE) {
      layout.known = true;
      break;
    }
    if (result != CUDA_SUCCESS || index > 4096) {
      layout.offsets.clear();
      layout.sizes.clear();
      break;
    }
    layout.offsets.push_back(static_cast<uint32_t>(offset));
    layout.sizes.push_back(static_cast<uint32_t>(size));
  }
  return layout;
}

}  // namespace delta::shim
