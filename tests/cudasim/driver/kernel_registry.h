// The kernels a program registered with cudasimRegisterKernel. A CUfunction is a pointer
// to a Function here; Functions are never freed, so handles and names stay valid for the
// life of the process (fault reports and CUPTI callbacks hold on to the names).
#pragma once

#include <cuda.h>

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
};

class KernelRegistry {
 public:
  void add(const void* symbol, const char* name, cudasimKernelBody body, int paramCount,
           const size_t* paramSizes);
  CUresult forSymbol(const void* symbol, CUfunction* out);
  // nullptr when `handle` is not a registered kernel.
  const Function* find(CUfunction handle);

 private:
  std::mutex mutex_;
  std::unordered_map<const void*, std::unique_ptr<Function>> bySymbol_;
  std::unordered_map<CUfunction, Function*> byHandle_;
};

}  // namespace cudasim
