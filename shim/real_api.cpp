#include "shim/real_api.h"

#include <dlfcn.h>

#include <mutex>

namespace delta::shim {

namespace {

// Not instrumented: dlsym's entry calls this while a sanitizer runtime initialises.
__attribute__((no_sanitize("address", "undefined", "thread"))) DlsymFunction findRealDlsym() {
  // glibc 2.34 moved dlsym into libc with a new version; older ones have GLIBC_2.2.5.
  void* found = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (found == nullptr) found = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  return reinterpret_cast<DlsymFunction>(found);
}

}  // namespace

__attribute__((no_sanitize("address", "undefined", "thread"))) DlsymFunction realDlsym() {
  // Neither a function-local static with a dynamic initialiser (its guard, __cxa_guard_*, is
  // intercepted by ThreadSanitizer, which calls this before it is initialised) nor std::atomic
  // (its member functions are instrumented): a plain pointer read and written with the
  // compiler's atomic builtins. Two threads racing here find the same answer.
  static constinit DlsymFunction cached = nullptr;
  DlsymFunction function = __atomic_load_n(&cached, __ATOMIC_RELAXED);
  if (function == nullptr) {
    function = findRealDlsym();
    __atomic_store_n(&cached, function, __ATOMIC_RELAXED);
  }
  return function;
}

bool loadDriver(DriverApi& api) {
  // RTLD_NOLOAD first: the program's runtime has normally loaded the driver already, and
  // we want that very library, not another one found on a different path.
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (handle == nullptr) handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return false;
  auto getProc = reinterpret_cast<decltype(&::cuGetProcAddress_v2)>(
      realDlsym()(handle, "cuGetProcAddress_v2"));
  if (getProc == nullptr) return false;
  // Base names, as cuGetProcAddress wants them.
  auto fetch = [&](const char* versioned, void** out) {
    char base[64];
    size_t length = 0;
    while (versioned[length] && length < sizeof base - 1) {
      base[length] = versioned[length];
      ++length;
    }
    base[length] = '\0';
    if (length > 3 && base[length - 3] == '_' && base[length - 2] == 'v' && base[length - 1] == '2')
      base[length - 3] = '\0';
    return getProc(base, out, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, nullptr) == CUDA_SUCCESS &&
           *out != nullptr;
  };
  bool complete = true;
#define DELTA_FETCH(name) complete = fetch(#name, reinterpret_cast<void**>(&api.name)) && complete;
  DELTA_DRIVER_FUNCTIONS(DELTA_FETCH)
#undef DELTA_FETCH
  return complete;
}

const RuntimeApi& runtimeApi() {
  static RuntimeApi api = [] {
    RuntimeApi found;
    DlsymFunction lookup = realDlsym();
    found.cudaMalloc = reinterpret_cast<decltype(found.cudaMalloc)>(lookup(RTLD_NEXT, "cudaMalloc"));
    found.cudaFree = reinterpret_cast<decltype(found.cudaFree)>(lookup(RTLD_NEXT, "cudaFree"));
    found.cudaMemGetInfo =
        reinterpret_cast<decltype(found.cudaMemGetInfo)>(lookup(RTLD_NEXT, "cudaMemGetInfo"));
    found.cudaGetFuncBySymbol = reinterpret_cast<decltype(found.cudaGetFuncBySymbol)>(
        lookup(RTLD_NEXT, "cudaGetFuncBySymbol"));
    found.cudaIpcGetMemHandle = reinterpret_cast<decltype(found.cudaIpcGetMemHandle)>(
        lookup(RTLD_NEXT, "cudaIpcGetMemHandle"));
    found.cudaIpcOpenMemHandle = reinterpret_cast<decltype(found.cudaIpcOpenMemHandle)>(
        lookup(RTLD_NEXT, "cudaIpcOpenMemHandle"));
    found.cudaIpcCloseMemHandle = reinterpret_cast<decltype(found.cudaIpcCloseMemHandle)>(
        lookup(RTLD_NEXT, "cudaIpcCloseMemHandle"));
    found.cudaGetLastError =
        reinterpret_cast<decltype(found.cudaGetLastError)>(lookup(RTLD_NEXT, "cudaGetLastError"));
    found.cudaPeekAtLastError = reinterpret_cast<decltype(found.cudaPeekAtLastError)>(
        lookup(RTLD_NEXT, "cudaPeekAtLastError"));
    return found;
  }();
  return api;
}

InterceptedDriver& interceptedDriver() {
  static InterceptedDriver driver;
  return driver;
}

const char* resultText(const DriverApi& api, CUresult result) {
  const char* text = nullptr;
  if (api.cuGetErrorString == nullptr || api.cuGetErrorString(result, &text) != CUDA_SUCCESS ||
      text == nullptr)
    return "unknown CUDA error";
  return text;
}

}  // namespace delta::shim
