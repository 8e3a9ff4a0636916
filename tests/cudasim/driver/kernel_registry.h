// The kernels a program registered with cudasimRegisterKernel. A CUfunction is a pointer
// to a Function here; Functions are never freed, so handles and names stay valid for the
// life of the process (fault reports and CUPTI callbacks hold on to the names).
//
// A CUkernel (CUDA 13's <<<>>> launches through one: cudaGetKernel, then __cudaLaunchKernel)
// is a separate object on the heap, as the real runtime's is, never equal to the symbol or
// the CUfunction. As under the real driver's lazy loading (the default), the kernel has no
// CUfunction in the context until something loads it: a launch, or a lookup by symbol.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cudasim/cudasim.h"

namespace cudasim {

struct Function {
  std::string name;
  cudasimKernelBody body;
  std::vector<size_t> sizes;
  std::vector<size_t> offsets;  // in the packed layout used by `extra` and cuFuncGetParamInfo
  size_t packedBytes = 0;
  // Loaded into the context (CUDA_MODULE_LOADING=EAGER: from the start).
  std::atomic<bool> loaded{false};
};

struct Kernel {
  Function* function;
};

class KernelRegistry {
 public:
  void add(const void* symbol, const char* name, cudasimKernelBody body, int paramCount,
           const size_t* paramSizes);
  // Loads the function: the runtime asks this to launch by symbol or to answer
  // cudaGetFuncBySymbol.
  CUresult forSymbol(const void* symbol, CUfunction* out);
  // The kernel handle of a registered symbol (made at the first ask, then the same).
  CUresult kernelForSymbol(const void* symbol, CUkernel* out);
  // nullptr when `handle` is not a kernel handle.
  Kernel* findKernel(CUkernel handle);
  // nullptr when `handle` is not a registered kernel.
  const Function* find(CUfunction handle);

 private:
  std::mutex mutex_;
  std::unordered_map<const void*, std::unique_ptr<Function>> bySymbol_;
  std::unordered_map<CUfunction, Function*> byHandle_;
  std::unordered_map<const void*, std::unique_ptr<Kernel>> kernelBySymbol_;
  std::unordered_map<CUkernel, Kernel*> byKernel_;
};

}  // namespace cudasim
