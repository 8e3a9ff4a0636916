#include "shim/param_scanner.h"

#include "shim/log.h"

#include <atomic>

namespace delta::shim {

namespace {
std::atomic<uint64_t> gCacheGenerations{0};

struct CachedLayout {
  uint64_t generation;
  const void* handle;
  const ParamLayout* layout;
};
// Per thread: zero-initialised, no constructor or destructor (nothing to run at thread exit).
constexpr size_t kThreadSlots = 64;
thread_local CachedLayout tLayouts[kThreadSlots];
}  // namespace

ParamLayoutCache::ParamLayoutCache() : generation_(gCacheGenerations.fetch_add(1) + 1) {}

const ParamLayout& ParamLayoutCache::layout(const DriverApi& api, LaunchTarget target) {
  CachedLayout& slot = tLayouts[(reinterpret_cast<uintptr_t>(target.handle) >> 4) % kThreadSlots];
  if (slot.generation == generation_ && slot.handle == target.handle) [[likely]]
    return *slot.layout;
  const ParamLayout& found = lookupLocked(api, target);
  slot = CachedLayout{generation_, target.handle, &found};
  return found;
}

CUresult targetParamInfo(const DriverApi& api, LaunchTarget target, size_t index, size_t* offset,
                         size_t* size) {
  void* handle = const_cast<void*>(target.handle);
  return target.kernelHandle
             ? api.cuKernelGetParamInfo(static_cast<CUkernel>(handle), index, offset, size)
             : api.cuFuncGetParamInfo(static_cast<CUfunction>(handle), index, offset, size);
}

const char* targetName(const DriverApi& api, LaunchTarget target) {
  const char* name = nullptr;
  void* handle = const_cast<void*>(target.handle);
  const CUresult named =
      target.kernelHandle
          ? (api.cuKernelGetName ? api.cuKernelGetName(&name, static_cast<CUkernel>(handle))
                                 : CUDA_ERROR_NOT_FOUND)
          : (api.cuFuncGetName ? api.cuFuncGetName(&name, static_cast<CUfunction>(handle))
                               : CUDA_ERROR_NOT_FOUND);
  return named == CUDA_SUCCESS ? name : nullptr;
}

const ParamLayout& ParamLayoutCache::lookupLocked(const DriverApi& api, LaunchTarget target) {
  std::lock_guard lock(mutex_);
  auto [it, inserted] = layouts_.try_emplace(target.handle);
  if (!inserted) return it->second;
  ParamLayout& layout = it->second;
  // Parameters are numbered until the driver says CUDA_ERROR_INVALID_VALUE; any other
  // error means the driver cannot describe this function.
  for (size_t index = 0;; ++index) {
    size_t offset = 0, size = 0;
    CUresult result = targetParamInfo(api, target, index, &offset, &size);
    if (result == CUDA_ERROR_INVALID_VALUE) {
      layout.known = true;
      break;
    }
    if (result != CUDA_SUCCESS || index > 4096) {
      layout.offsets.clear();
      layout.sizes.clear();
      const char* name = targetName(api, target);
      logVerbose(1, "launches of %s cannot be analysed: the driver does not describe its "
                 "parameter %zu (%s: error %d); each brings every buffer back",
                 name ? name : "a kernel", index,
                 target.kernelHandle ? "cuKernelGetParamInfo" : "cuFuncGetParamInfo",
                 static_cast<int>(result));
      break;
    }
    layout.offsets.push_back(static_cast<uint32_t>(offset));
    layout.sizes.push_back(static_cast<uint32_t>(size));
  }
  return layout;
}

}  // namespace delta::shim
