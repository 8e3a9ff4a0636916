#include "kernel_registry.h"

#include <cstdlib>
#include <cstring>

namespace cudasim {
namespace {

// Alignment of a parameter whose type we do not know: the largest power of two dividing
// its size, at most 8 (what the natural alignment of any scalar or struct of scalars is).
size_t alignmentFor(size_t size) {
  size_t alignment = 1;
  while (alignment < 8 && size % (alignment * 2) == 0) alignment *= 2;
  return alignment;
}

}  // namespace

void KernelRegistry::add(const void* symbol, const char* name, cudasimKernelBody body,
                         int paramCount, const size_t* paramSizes) {
  auto function = std::make_unique<Function>();
  function->name = name ? name : "<unnamed kernel>";
  function->body = body;
  size_t offset = 0;
  for (int i = 0; i < paramCount; ++i) {
    const size_t alignment = alignmentFor(paramSizes[i]);
    offset = (offset + alignment - 1) / alignment * alignment;
    function->sizes.push_back(paramSizes[i]);
    function->offsets.push_back(offset);
    offset += paramSizes[i];
  }
  function->packedBytes = offset;
  const char* loading = std::getenv("CUDA_MODULE_LOADING");
  function->loaded = loading != nullptr && std::strcmp(loading, "EAGER") == 0;
  std::lock_guard lock(mutex_);
  auto& slot = bySymbol_[symbol];
  if (slot) {
    // Re-registration replaces the definition but keeps the handle valid.
    slot->name = std::move(function->name);
    slot->body = function->body;
    slot->sizes = std::move(function->sizes);
    slot->offsets = std::move(function->offsets);
    slot->packedBytes = function->packedBytes;
  } else {
    slot = std::move(function);
    byHandle_[reinterpret_cast<CUfunction>(slot.get())] = slot.get();
  }
}

CUresult KernelRegistry::forSymbol(const void* symbol, CUfunction* out) {
  std::lock_guard lock(mutex_);
  auto it = bySymbol_.find(symbol);
  if (it == bySymbol_.end()) return CUDA_ERROR_INVALID_HANDLE;
  it->second->loaded.store(true, std::memory_order_relaxed);
  *out = reinterpret_cast<CUfunction>(it->second.get());
  return CUDA_SUCCESS;
}

CUresult KernelRegistry::kernelForSymbol(const void* symbol, CUkernel* out) {
  std::lock_guard lock(mutex_);
  auto function = bySymbol_.find(symbol);
  if (function == bySymbol_.end()) return CUDA_ERROR_INVALID_HANDLE;
  auto& kernel = kernelBySymbol_[symbol];
  if (!kernel) {
    kernel = std::make_unique<Kernel>(Kernel{function->second.get()});
    byKernel_[reinterpret_cast<CUkernel>(kernel.get())] = kernel.get();
  }
  *out = reinterpret_cast<CUkernel>(kernel.get());
  return CUDA_SUCCESS;
}

Kernel* KernelRegistry::findKernel(CUkernel handle) {
  std::lock_guard lock(mutex_);
  auto it = byKernel_.find(handle);
  return it == byKernel_.end() ? nullptr : it->second;
}

const Function* KernelRegistry::find(CUfunction handle) {
  std::lock_guard lock(mutex_);
  auto it = byHandle_.find(handle);
  return it == byHandle_.end() ? nullptr : it->second;
}

}  // namespace cudasim
