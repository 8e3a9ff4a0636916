#include "shim/param_scanner.h"

namespace delta::shim {

const ParamLayout& ParamLayoutCache::layout(const DriverApi& api, CUfunction function) {
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
