#include "shim/cupti_switchboard.h"

#include <dlfcn.h>

#include <cupti.h>  // also the generated *_params structs

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "shim/code_address.h"
#include "shim/log.h"
#include "shim/reentry_guard.h"

namespace delta::shim {
namespace {

// What a callback id means to the shim.
enum class Work : uint8_t {
  kIgnore,
  kDriverLaunch,      // cuLaunchKernel_params layout
  kDriverLaunchEx,    // cuLaunchKernelEx_params
  kDriverCooperative, // cuLaunchCooperativeKernel_params
  kRuntimeLaunch,     // cudaLaunchKernel_v7000_params (and cooperative, same layout)
  kRuntimeLaunchEx,   // cudaLaunchKernelExC_v11060_params
  kRuntimeKernelLaunch, // __cudaLaunchKernel: a cudaKernel_t, otherwise as cudaLaunchKernel
  kUnified,           // cuMemcpy(dst, src, bytes)
  kUnifiedAsync,      // cuMemcpyAsync(dst, src, bytes, stream)
  kHtoD, kHtoDAsync, kDtoH, kDtoHAsync, kDtoD, kDtoDAsync,
  kMemset8, kMemset16, kMemset32, kMemset8Async, kMemset16Async, kMemset32Async,
  kMemset2D8, kMemset2D16, kMemset2D32,   // synchronous and async share the leading fields
  kRuntimeMemcpy,     // cudaMemcpy(dst, src, count, kind)
  kRuntimeMemcpyAsync,
  kRuntimeMemset,     // cudaMemset(ptr, value, count)
  kRuntimeMemsetAsync,
  kCopy2D,            // cuMemcpy2D(pCopy): the rows' spans, no array side
  kCopy2DAsync,       // cuMemcpy2DAsync(pCopy, stream)
  kRuntimeCopy2D,     // cudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind)
  kRuntimeCopy2DAsync,  // cudaMemcpy2DAsync(..., kind, stream)
  kOpaque,            // graphs, 3D/peer/batch/array/symbol copies: not analysed
};

struct Route {
  Work work = Work::kIgnore;
  bool perThread = false;  // a _ptsz/_ptds variant: stream 0 is the thread's default stream
};

Route gDriverRoutes[CUPTI_DRIVER_TRACE_CBID_SIZE];
Route gRuntimeRoutes[CUPTI_RUNTIME_TRACE_CBID_SIZE];

void buildRoutes() {
  auto d = [](CUpti_CallbackId id, Work work, bool perThread = false) {
    gDriverRoutes[id] = Route{work, perThread};
  };
  auto r = [](CUpti_CallbackId id, Work work, bool perThread = false) {
    gRuntimeRoutes[id] = Route{work, perThread};
  };
#define D(name, work) d(CUPTI_DRIVER_TRACE_CBID_##name, Work::work)
#define DPT(name, work) d(CUPTI_DRIVER_TRACE_CBID_##name, Work::work, true)
  D(cuLaunchKernel, kDriverLaunch);            DPT(cuLaunchKernel_ptsz, kDriverLaunch);
  D(cuLaunchKernelEx, kDriverLaunchEx);        DPT(cuLaunchKernelEx_ptsz, kDriverLaunchEx);
  D(cuLaunchCooperativeKernel, kDriverCooperative);
  DPT(cuLaunchCooperativeKernel_ptsz, kDriverCooperative);
  D(cuGraphLaunch, kOpaque);                   DPT(cuGraphLaunch_ptsz, kOpaque);
  D(cuMemcpy, kUnified);                       DPT(cuMemcpy_ptds, kUnified);
  D(cuMemcpyAsync, kUnifiedAsync);             DPT(cuMemcpyAsync_ptsz, kUnifiedAsync);
  D(cuMemcpyHtoD_v2, kHtoD);                   DPT(cuMemcpyHtoD_v2_ptds, kHtoD);
  D(cuMemcpyHtoDAsync_v2, kHtoDAsync);         DPT(cuMemcpyHtoDAsync_v2_ptsz, kHtoDAsync);
  D(cuMemcpyDtoH_v2, kDtoH);                   DPT(cuMemcpyDtoH_v2_ptds, kDtoH);
  D(cuMemcpyDtoHAsync_v2, kDtoHAsync);         DPT(cuMemcpyDtoHAsync_v2_ptsz, kDtoHAsync);
  D(cuMemcpyDtoD_v2, kDtoD);                   DPT(cuMemcpyDtoD_v2_ptds, kDtoD);
  D(cuMemcpyDtoDAsync_v2, kDtoDAsync);         DPT(cuMemcpyDtoDAsync_v2_ptsz, kDtoDAsync);
  D(cuMemsetD8_v2, kMemset8);                  DPT(cuMemsetD8_v2_ptds, kMemset8);
  D(cuMemsetD16_v2, kMemset16);                DPT(cuMemsetD16_v2_ptds, kMemset16);
  D(cuMemsetD32_v2, kMemset32);                DPT(cuMemsetD32_v2_ptds, kMemset32);
  D(cuMemsetD8Async, kMemset8Async);           DPT(cuMemsetD8Async_ptsz, kMemset8Async);
  D(cuMemsetD16Async, kMemset16Async);         DPT(cuMemsetD16Async_ptsz, kMemset16Async);
  D(cuMemsetD32Async, kMemset32Async);         DPT(cuMemsetD32Async_ptsz, kMemset32Async);
  D(cuMemsetD2D8_v2, kMemset2D8);              DPT(cuMemsetD2D8_v2_ptds, kMemset2D8);
  D(cuMemsetD2D16_v2, kMemset2D16);            DPT(cuMemsetD2D16_v2_ptds, kMemset2D16);
  D(cuMemsetD2D32_v2, kMemset2D32);            DPT(cuMemsetD2D32_v2_ptds, kMemset2D32);
  D(cuMemsetD2D8Async, kMemset2D8);            DPT(cuMemsetD2D8Async_ptsz, kMemset2D8);
  D(cuMemsetD2D16Async, kMemset2D16);          DPT(cuMemsetD2D16Async_ptsz, kMemset2D16);
  D(cuMemsetD2D32Async, kMemset2D32);          DPT(cuMemsetD2D32Async_ptsz, kMemset2D32);
  D(cuMemcpy2D_v2, kCopy2D);                   DPT(cuMemcpy2D_v2_ptds, kCopy2D);
  D(cuMemcpy2DAsync_v2, kCopy2DAsync);         DPT(cuMemcpy2DAsync_v2_ptsz, kCopy2DAsync);
  D(cuMemcpy2DUnaligned_v2, kCopy2D);          DPT(cuMemcpy2DUnaligned_v2_ptds, kCopy2D);
  for (CUpti_CallbackId id : {
                              CUPTI_DRIVER_TRACE_CBID_cuMemcpy3D_v2, CUPTI_DRIVER_TRACE_CBID_cuMemcpy3D_v2_ptds,
                              CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DAsync_v2, CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DAsync_v2_ptsz,
                              CUPTI_DRIVER_TRACE_CBID_cuMemcpyPeer, CUPTI_DRIVER_TRACE_CBID_cuMemcpyPeer_ptds,
                              CUPTI_DRIVER_TRACE_CBID_cuMemcpyPeerAsync, CUPTI_DRIVER_TRACE_CBID_cuMemcpyPeerAsync_ptsz,
                              CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DPeer, CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DPeer_ptds,
                              CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DPeerAsync, CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DPeerAsync_ptsz,
                              CUPTI_DRIVER_TRACE_CBID_cuMemcpyBatchAsync_v2, CUPTI_DRIVER_TRACE_CBID_cuMemcpyBatchAsync_v2_ptsz,
                              CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DBatchAsync_v2, CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DBatchAsync_v2_ptsz,
                              CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoA_v2, CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoA_v2_ptds,
                              CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoD_v2, CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoD_v2_ptds})
    d(id, Work::kOpaque);
#undef D
#undef DPT
#define R(name, work) r(CUPTI_RUNTIME_TRACE_CBID_##name, Work::work)
#define RPT(name, work) r(CUPTI_RUNTIME_TRACE_CBID_##name, Work::work, true)
  R(cudaLaunchKernel_v7000, kRuntimeLaunch);           RPT(cudaLaunchKernel_ptsz_v7000, kRuntimeLaunch);
  R(cudaLaunchCooperativeKernel_v9000, kRuntimeLaunch); RPT(cudaLaunchCooperativeKernel_ptsz_v9000, kRuntimeLaunch);
  R(cudaLaunchKernelExC_v11060, kRuntimeLaunchEx);     RPT(cudaLaunchKernelExC_ptsz_v11060, kRuntimeLaunchEx);
  R(__cudaLaunchKernel_v13000, kRuntimeKernelLaunch);  RPT(__cudaLaunchKernel_ptsz_v13000, kRuntimeKernelLaunch);
  R(cudaMemcpy_v3020, kRuntimeMemcpy);                 RPT(cudaMemcpy_ptds_v7000, kRuntimeMemcpy);
  R(cudaMemcpyAsync_v3020, kRuntimeMemcpyAsync);       RPT(cudaMemcpyAsync_ptsz_v7000, kRuntimeMemcpyAsync);
  R(cudaMemset_v3020, kRuntimeMemset);                 RPT(cudaMemset_ptds_v7000, kRuntimeMemset);
  R(cudaMemsetAsync_v3020, kRuntimeMemsetAsync);       RPT(cudaMemsetAsync_ptsz_v7000, kRuntimeMemsetAsync);
  R(cudaGraphLaunch_v10000, kOpaque);                  RPT(cudaGraphLaunch_ptsz_v10000, kOpaque);
  R(cudaMemcpy2D_v3020, kRuntimeCopy2D);               RPT(cudaMemcpy2D_ptds_v7000, kRuntimeCopy2D);
  R(cudaMemcpy2DAsync_v3020, kRuntimeCopy2DAsync);     RPT(cudaMemcpy2DAsync_ptsz_v7000, kRuntimeCopy2DAsync);
  for (CUpti_CallbackId id : {CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy3D_v3020, CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy3D_ptds_v7000,
                              CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy3DAsync_v3020, CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy3DAsync_ptsz_v7000,
                              CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyPeer_v4000, CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyPeerAsync_v4000,
                              CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyToSymbol_v3020, CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyFromSymbol_v3020,
                              CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyToSymbolAsync_v3020, CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyFromSymbolAsync_v3020,
                              CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyBatchAsync_v13000, CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy3DBatchAsync_v13000,
                              CUPTI_RUNTIME_TRACE_CBID_cudaMemset2D_v3020, CUPTI_RUNTIME_TRACE_CBID_cudaMemset2DAsync_v3020,
                              CUPTI_RUNTIME_TRACE_CBID_cudaMemset3D_v3020, CUPTI_RUNTIME_TRACE_CBID_cudaMemset3DAsync_v3020})
    r(id, Work::kOpaque);
#undef R
#undef RPT
}

struct Context {
  const DriverApi* api = nullptr;
  Residency* residency = nullptr;
  ParamLayoutCache layouts;
  decltype(&::cudaGetFuncBySymbol) getFuncBySymbol = nullptr;
  std::mutex symbolMutex;
  std::unordered_map<const void*, LaunchTarget> targetsBySymbol;
  // Tells this Context's answers in the threads' caches apart (set when made), and is moved on
  // when an answer changes (a function learnt for a symbol), so that every thread asks again.
  std::atomic<uint64_t> generation{0};
};
Context* gContext = nullptr;

thread_local bool tPreparedByInterposer = false;
// The calls whose buffers are held until their API_EXIT, innermost last. The driver calls a
// handled runtime call makes carry its correlation id, and so do calls made from inside a
// callback (real CUPTI); only those made at the same program-call depth are the runtime's own.
struct OpenCall {
  uint32_t correlation;
  CUpti_CallbackDomain domain;
  CUpti_CallbackId cbid;
  int programCallDepth;  // tProgramCallDepth when it was opened
};
thread_local std::vector<OpenCall> tOpenCalls;
thread_local std::vector<uint64_t> tCandidates;

// What a runtime launch's `func` stands for: a host stub the runtime maps to a function, or a
// kernel handle (cudaKernel_t) passed in its place, as CUDA 13's <<<>>> does (seen on an H200:
// CUPTI reports those launches as cudaLaunchKernel, `func` the handle). Every runtime launch
// asks, so each thread keeps the answers it got in a small direct-mapped cache: no lock unless
// the pointer is new to the thread. An answer changes only when a function is learnt for a
// stub (learnFunction), which moves the Context's generation on.
struct CachedTarget {
  uint64_t generation;  // the Context's; 0 (never a Context's) in a thread's fresh cache
  const void* symbol;
  LaunchTarget target;
};
constexpr size_t kTargetSlots = 64;
thread_local CachedTarget tTargets[kTargetSlots];
std::atomic<uint64_t> gContextGenerations{0};

LaunchTarget lookupTargetLocked(const void* symbol, const char* name);

LaunchTarget targetForSymbol(const void* symbol, const char* name = nullptr) {
  Context& c = *gContext;
  CachedTarget& slot = tTargets[(reinterpret_cast<uintptr_t>(symbol) >> 4) % kTargetSlots];
  const uint64_t generation = c.generation.load(std::memory_order_acquire);
  if (slot.generation == generation && slot.symbol == symbol) [[likely]] return slot.target;
  const LaunchTarget target = lookupTargetLocked(symbol, name);
  slot = CachedTarget{generation, symbol, target};
  return target;
}

// A runtime launch whose `func` this runtime does not know (the stub of a runtime linked
// statically into a library: cuBLAS's, cuDNN's) is prepared whole. The driver launch that
// runtime then makes for it, with the runtime call's correlation id, names its function: learnt
// here, later launches of that stub are analysed. Where no such driver callback comes (a driver
// may raise none for a runtime's own calls), every launch of it stays prepared whole. The
// expectation is set once the runtime launch is prepared (after any recompute callback it ran,
// whose launches carry the same correlation id on a real driver), so the next driver launch of
// this call at this program-call depth is the runtime's own.
thread_local const void* tUnknownStub = nullptr;
thread_local uint32_t tUnknownStubCorrelation = 0;  // 0: the next driver launch (an interposer's)
thread_local int tUnknownStubDepth = 0;

void expectDriverLaunch(const void* stub, uint32_t correlation) {
  tUnknownStub = stub;
  tUnknownStubCorrelation = correlation;
  tUnknownStubDepth = tProgramCallDepth;
}

void learnFunction(const void* stub, CUfunction function, const char* name) {
  Context& c = *gContext;
  {
    std::lock_guard lock(c.symbolMutex);
    LaunchTarget& target = c.targetsBySymbol[stub];
    if (target) return;
    target = LaunchTarget::function(function);
  }
  c.generation.store(gContextGenerations.fetch_add(1) + 1, std::memory_order_release);
  logVerbose(1, "launches of %s: its function learnt from the driver's launch of it; analysed "
             "from now on", name ? name : "a kernel");
}

// A pointer the runtime does not know as a stub is a kernel handle if it is data and the
// driver describes it as a kernel. Code is a stub of another runtime instance (a library
// linking the runtime statically): never handed to the driver, which does not check handles.
bool isKernelHandle(const void* pointer) {
  if (isCodeOrUnknownAddress(pointer)) return false;
  const auto kernel = LaunchTarget::kernel(static_cast<CUkernel>(const_cast<void*>(pointer)));
  size_t offset = 0, size = 0;
  const CUresult described = targetParamInfo(*gContext->api, kernel, 0, &offset, &size);
  return described == CUDA_SUCCESS || described == CUDA_ERROR_INVALID_VALUE;  // no parameters
}

LaunchTarget lookupTargetLocked(const void* symbol, const char* name) {
  Context& c = *gContext;
  std::lock_guard lock(c.symbolMutex);
  auto [it, inserted] = c.targetsBySymbol.try_emplace(symbol);
  if (!inserted || c.getFuncBySymbol == nullptr) return it->second;
  const RuntimeApi& runtime = runtimeApi();
  cudaFunction_t function = nullptr;
  ReentryGuard guard;
  const cudaError_t before =
      runtime.cudaPeekAtLastError ? runtime.cudaPeekAtLastError() : cudaSuccess;
  const cudaError_t found = c.getFuncBySymbol(&function, symbol);
  if (found == cudaSuccess) {
    it->second = LaunchTarget::function(reinterpret_cast<CUfunction>(function));
    return it->second;
  }
  // The failed lookup is the shim's, not the program's: a program that reads cudaGetLastError
  // after each launch (PyTorch does) must not find it there. An error the program had not yet
  // read stays.
  if (before == cudaSuccess && runtime.cudaGetLastError) runtime.cudaGetLastError();
  if (isKernelHandle(symbol)) {
    it->second = LaunchTarget::kernel(static_cast<CUkernel>(const_cast<void*>(symbol)));
  } else {
    logVerbose(1, "launches of %s cannot be analysed: %p is neither a kernel handle nor a "
               "symbol this runtime knows (cudaGetFuncBySymbol: error %d); each brings every "
               "buffer back",
               name ? name : "a kernel", symbol, static_cast<int>(found));
  }
  return it->second;
}

// `failable`: called by a launch interposer, which fails the call on an error (CUPTI cannot).
CUresult launch(LaunchTarget target, CUstream stream, bool perThread, void** params,
                void** extra, const char* name, const uint32_t grid[3] = nullptr,
                const uint32_t block[3] = nullptr, bool failable = false) {
  Context& c = *gContext;
  if (!target) return c.residency->prepareEverything(stream, perThread, failable);
  const ParamLayout& layout = c.layouts.layout(*c.api, target);
  tCandidates.clear();
  if (!scanParams(layout, params, extra, [](uint64_t value) { tCandidates.push_back(value); }))
    return c.residency->prepareEverything(stream, perThread, failable);
  Residency::Touch touch;
  touch.pointers = tCandidates.data();
  touch.pointerCount = tCandidates.size();
  touch.kind = UseKind::kKernel;
  WorkInfo work;
  work.kind = WorkInfo::Kind::kKernel;
  work.name = name;
  work.failable = failable;
  for (int i = 0; i < 3; ++i) {
    work.grid[i] = grid ? grid[i] : 0;
    work.block[i] = block ? block[i] : 0;
  }
  return c.residency->prepare(stream, perThread, &touch, 1, work);
}

// `kind`: the direction as the call states it (kDefault: unified addressing, inferred). The
// residency manager learns pointer tables from what copies and memsets write.
void copy(uint64_t dst, uint64_t src, size_t bytes, CUstream stream, bool perThread,
          trace::CopyKind kind) {
  Context& c = *gContext;
  Residency::Touch touches[2];
  touches[0].rangeStart = dst;
  touches[0].rangeBytes = bytes;
  touches[0].kind = UseKind::kWrite;
  touches[1].rangeStart = src;
  touches[1].rangeBytes = bytes;
  touches[1].kind = UseKind::kRead;
  WorkInfo work;
  work.kind = WorkInfo::Kind::kCopy;
  work.copyKind = kind;
  work.bytes = bytes;
  work.copyDst = dst;
  work.copySrc = src;
  c.residency->prepare(stream, perThread, touches, 2, work);
}

void memset(uint64_t dst, size_t bytes, CUstream stream, bool perThread) {
  Residency::Touch touch;
  touch.rangeStart = dst;
  touch.rangeBytes = bytes;
  touch.kind = UseKind::kWrite;
  WorkInfo work;
  work.kind = WorkInfo::Kind::kMemset;
  work.bytes = bytes;
  work.copyDst = dst;
  gContext->residency->prepare(stream, perThread, &touch, 1, work);
}

// A 2D copy: `height` rows of `width` bytes at each side's pitch. Its buffers are found by the
// two spans; it teaches no pointer tables (a table is not written row by row at a pitch).
void copy2D(uint64_t dst, size_t dpitch, uint64_t src, size_t spitch, size_t width, size_t height,
            CUstream stream, bool perThread) {
  Residency::Touch touches[2];
  touches[0].rangeStart = dst;
  touches[0].rangeBytes = height == 0 ? 0 : dpitch * (height - 1) + width;
  touches[0].kind = UseKind::kWrite;
  touches[1].rangeStart = src;
  touches[1].rangeBytes = height == 0 ? 0 : spitch * (height - 1) + width;
  touches[1].kind = UseKind::kRead;
  WorkInfo work;
  work.kind = WorkInfo::Kind::kKernel;
  work.name = "a 2D copy";
  gContext->residency->prepare(stream, perThread, touches, 2, work);
}

template <class P>
const P& as(const void* params) {
  return *static_cast<const P*>(params);
}

// The stream of work not analysed, where its parameters name one (nullptr: the legacy default
// stream, which the synchronous forms use). Everything is restored on it and the use recorded
// there: restored on the legacy stream instead, a copy on a non-blocking stream could read the
// buffer before its contents were back, and an eviction after it would not wait for it.
CUstream opaqueStream(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* p) {
#define DRIVER_STREAM(name, field) \
  case CUPTI_DRIVER_TRACE_CBID_##name: return as<name##_params>(p).field;
#define RUNTIME_STREAM(name) \
  case CUPTI_RUNTIME_TRACE_CBID_##name: return reinterpret_cast<CUstream>(as<name##_params>(p).stream);
  if (domain == CUPTI_CB_DOMAIN_DRIVER_API) {
    switch (cbid) {
      DRIVER_STREAM(cuMemcpy2DAsync_v2, hStream) DRIVER_STREAM(cuMemcpy2DAsync_v2_ptsz, hStream)
      DRIVER_STREAM(cuMemcpy3DAsync_v2, hStream) DRIVER_STREAM(cuMemcpy3DAsync_v2_ptsz, hStream)
      DRIVER_STREAM(cuMemcpyPeerAsync, hStream) DRIVER_STREAM(cuMemcpyPeerAsync_ptsz, hStream)
      DRIVER_STREAM(cuMemcpy3DPeerAsync, hStream) DRIVER_STREAM(cuMemcpy3DPeerAsync_ptsz, hStream)
      DRIVER_STREAM(cuGraphLaunch, hStream) DRIVER_STREAM(cuGraphLaunch_ptsz, hStream)
      default: return nullptr;
    }
  }
  switch (cbid) {
    RUNTIME_STREAM(cudaMemcpy2DAsync_v3020) RUNTIME_STREAM(cudaMemcpy2DAsync_ptsz_v7000)
    RUNTIME_STREAM(cudaMemcpy3DAsync_v3020) RUNTIME_STREAM(cudaMemcpy3DAsync_ptsz_v7000)
    RUNTIME_STREAM(cudaMemcpyPeerAsync_v4000) RUNTIME_STREAM(cudaMemset2DAsync_v3020)
    RUNTIME_STREAM(cudaMemset3DAsync_v3020) RUNTIME_STREAM(cudaGraphLaunch_v10000)
    RUNTIME_STREAM(cudaGraphLaunch_ptsz_v10000) RUNTIME_STREAM(cudaMemcpyToSymbolAsync_v3020)
    RUNTIME_STREAM(cudaMemcpyFromSymbolAsync_v3020)
    default: return nullptr;
  }
#undef DRIVER_STREAM
#undef RUNTIME_STREAM
}

void handle(Work work, bool perThread, const CUpti_CallbackData& data, CUpti_CallbackDomain domain,
            CUpti_CallbackId cbid) {
  const void* p = data.functionParams;
  const char* name = data.symbolName;
  switch (work) {
    case Work::kIgnore:
      return;
    case Work::kDriverLaunch: {
      auto& a = as<cuLaunchKernel_params>(p);
      const uint32_t grid[3] = {a.gridDimX, a.gridDimY, a.gridDimZ};
      const uint32_t block[3] = {a.blockDimX, a.blockDimY, a.blockDimZ};
      launch(LaunchTarget::function(a.f), a.hStream, perThread, a.kernelParams, a.extra, name,
             grid, block);
      return;
    }
    case Work::kDriverLaunchEx: {
      auto& a = as<cuLaunchKernelEx_params>(p);
      launch(LaunchTarget::function(a.f), a.config ? a.config->hStream : nullptr, perThread,
             a.kernelParams, a.extra, name);
      return;
    }
    case Work::kDriverCooperative: {
      auto& a = as<cuLaunchCooperativeKernel_params>(p);
      launch(LaunchTarget::function(a.f), a.hStream, perThread, a.kernelParams, nullptr, name);
      return;
    }
    case Work::kRuntimeLaunch: {
      auto& a = as<cudaLaunchKernel_v7000_params>(p);
      const uint32_t grid[3] = {a.gridDim.x, a.gridDim.y, a.gridDim.z};
      const uint32_t block[3] = {a.blockDim.x, a.blockDim.y, a.blockDim.z};
      const LaunchTarget target = targetForSymbol(a.func, name);
      launch(target, reinterpret_cast<CUstream>(a.stream), perThread, a.args, nullptr, name, grid,
             block);
      if (!target) expectDriverLaunch(a.func, data.correlationId);
      return;
    }
    case Work::kRuntimeKernelLaunch: {
      // __cudaLaunchKernel (CUDA 13's <<<>>>) takes a cudaKernel_t where cudaLaunchKernel
      // takes a stub; the driver describes a CUkernel's parameters through the same call.
      auto& a = as<cudaLaunchKernel_v7000_params>(p);
      launch(LaunchTarget::kernel(static_cast<CUkernel>(const_cast<void*>(a.func))),
             reinterpret_cast<CUstream>(a.stream), perThread, a.args, nullptr, name);
      return;
    }
    case Work::kRuntimeLaunchEx: {
      auto& a = as<cudaLaunchKernelExC_v11060_params>(p);
      const LaunchTarget target = targetForSymbol(a.func, name);
      launch(target, a.config ? reinterpret_cast<CUstream>(a.config->stream) : nullptr, perThread,
             a.args, nullptr, name);
      if (!target) expectDriverLaunch(a.func, data.correlationId);
      return;
    }
    case Work::kUnified: {
      auto& a = as<cuMemcpy_params>(p);
      return copy(a.dst, a.src, a.ByteCount, nullptr, perThread, trace::CopyKind::kDefault);
    }
    case Work::kUnifiedAsync: {
      auto& a = as<cuMemcpyAsync_params>(p);
      return copy(a.dst, a.src, a.ByteCount, a.hStream, perThread, trace::CopyKind::kDefault);
    }
    case Work::kHtoD: {
      auto& a = as<cuMemcpyHtoD_v2_params>(p);
      return copy(a.dstDevice, reinterpret_cast<uint64_t>(a.srcHost), a.ByteCount, nullptr, perThread, trace::CopyKind::kHostToDevice);
    }
    case Work::kHtoDAsync: {
      auto& a = as<cuMemcpyHtoDAsync_v2_params>(p);
      return copy(a.dstDevice, reinterpret_cast<uint64_t>(a.srcHost), a.ByteCount, a.hStream, perThread, trace::CopyKind::kHostToDevice);
    }
    case Work::kDtoH: {
      auto& a = as<cuMemcpyDtoH_v2_params>(p);
      return copy(reinterpret_cast<uint64_t>(a.dstHost), a.srcDevice, a.ByteCount, nullptr, perThread, trace::CopyKind::kDeviceToHost);
    }
    case Work::kDtoHAsync: {
      auto& a = as<cuMemcpyDtoHAsync_v2_params>(p);
      return copy(reinterpret_cast<uint64_t>(a.dstHost), a.srcDevice, a.ByteCount, a.hStream, perThread, trace::CopyKind::kDeviceToHost);
    }
    case Work::kDtoD: {
      auto& a = as<cuMemcpyDtoD_v2_params>(p);
      return copy(a.dstDevice, a.srcDevice, a.ByteCount, nullptr, perThread, trace::CopyKind::kDeviceToDevice);
    }
    case Work::kDtoDAsync: {
      auto& a = as<cuMemcpyDtoDAsync_v2_params>(p);
      return copy(a.dstDevice, a.srcDevice, a.ByteCount, a.hStream, perThread, trace::CopyKind::kDeviceToDevice);
    }
    case Work::kMemset8: {
      auto& a = as<cuMemsetD8_v2_params>(p);
      return memset(a.dstDevice, a.N, nullptr, perThread);
    }
    case Work::kMemset16: {
      auto& a = as<cuMemsetD16_v2_params>(p);
      return memset(a.dstDevice, a.N * 2, nullptr, perThread);
    }
    case Work::kMemset32: {
      auto& a = as<cuMemsetD32_v2_params>(p);
      return memset(a.dstDevice, a.N * 4, nullptr, perThread);
    }
    case Work::kMemset8Async: {
      auto& a = as<cuMemsetD8Async_params>(p);
      return memset(a.dstDevice, a.N, a.hStream, perThread);
    }
    case Work::kMemset16Async: {
      auto& a = as<cuMemsetD16Async_params>(p);
      return memset(a.dstDevice, a.N * 2, a.hStream, perThread);
    }
    case Work::kMemset32Async: {
      auto& a = as<cuMemsetD32Async_params>(p);
      return memset(a.dstDevice, a.N * 4, a.hStream, perThread);
    }
    case Work::kMemset2D8:
    case Work::kMemset2D16:
    case Work::kMemset2D32: {
      // The synchronous and async forms share these leading fields; the async one's stream
      // comes last and is read only for the async ids.
      auto& a = as<cuMemsetD2D8_v2_params>(p);
      const size_t element = work == Work::kMemset2D8 ? 1 : work == Work::kMemset2D16 ? 2 : 4;
      const size_t bytes = a.Height == 0 ? 0 : a.dstPitch * (a.Height - 1) + a.Width * element;
      CUstream stream = nullptr;
      if (std::strstr(data.functionName ? data.functionName : "", "Async"))
        stream = as<cuMemsetD2D8Async_params>(p).hStream;
      return memset(a.dstDevice, bytes, stream, perThread);
    }
    case Work::kCopy2D:
    case Work::kCopy2DAsync: {
      // cuMemcpy2D, cuMemcpy2DUnaligned and cuMemcpy2DAsync all start with pCopy; the async
      // one's stream follows it.
      const CUDA_MEMCPY2D* c = as<cuMemcpy2D_v2_params>(p).pCopy;
      if (c == nullptr) return;
      const CUstream stream =
          work == Work::kCopy2DAsync ? as<cuMemcpy2DAsync_v2_params>(p).hStream : nullptr;
      if (c->srcMemoryType == CU_MEMORYTYPE_ARRAY || c->dstMemoryType == CU_MEMORYTYPE_ARRAY) {
        gContext->residency->prepareEverything(stream, perThread);
        return;
      }
      auto at = [](CUmemorytype type, const void* host, CUdeviceptr device, size_t x, size_t y,
                   size_t pitch) {
        const uint64_t base = type == CU_MEMORYTYPE_HOST ? reinterpret_cast<uint64_t>(host) : device;
        return base + y * pitch + x;
      };
      return copy2D(at(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstXInBytes, c->dstY, c->dstPitch),
                    c->dstPitch,
                    at(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcXInBytes, c->srcY, c->srcPitch),
                    c->srcPitch, c->WidthInBytes, c->Height, stream, perThread);
    }
    case Work::kRuntimeCopy2D:
    case Work::kRuntimeCopy2DAsync: {
      auto& a = as<cudaMemcpy2D_v3020_params>(p);
      const CUstream stream =
          work == Work::kRuntimeCopy2DAsync
              ? reinterpret_cast<CUstream>(as<cudaMemcpy2DAsync_v3020_params>(p).stream)
              : nullptr;
      return copy2D(reinterpret_cast<uint64_t>(a.dst), a.dpitch, reinterpret_cast<uint64_t>(a.src),
                    a.spitch, a.width, a.height, stream, perThread);
    }
    case Work::kRuntimeMemcpy: {
      auto& a = as<cudaMemcpy_v3020_params>(p);
      return copy(reinterpret_cast<uint64_t>(a.dst), reinterpret_cast<uint64_t>(a.src), a.count,
                  nullptr, perThread, static_cast<trace::CopyKind>(a.kind));
    }
    case Work::kRuntimeMemcpyAsync: {
      auto& a = as<cudaMemcpyAsync_v3020_params>(p);
      return copy(reinterpret_cast<uint64_t>(a.dst), reinterpret_cast<uint64_t>(a.src), a.count,
                  reinterpret_cast<CUstream>(a.stream), perThread,
                  static_cast<trace::CopyKind>(a.kind));
    }
    case Work::kRuntimeMemset: {
      auto& a = as<cudaMemset_v3020_params>(p);
      return memset(reinterpret_cast<uint64_t>(a.devPtr), a.count, nullptr, perThread);
    }
    case Work::kRuntimeMemsetAsync: {
      auto& a = as<cudaMemsetAsync_v3020_params>(p);
      return memset(reinterpret_cast<uint64_t>(a.devPtr), a.count,
                    reinterpret_cast<CUstream>(a.stream), perThread);
    }
    case Work::kOpaque:
      // Graph launches and the copy forms not analysed here: everything comes back.
      gContext->residency->prepareEverything(opaqueStream(domain, cbid, p), perThread);
      return;
  }
}

void CUPTIAPI onCallback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                         const void* callbackData) {
  if (insideShim() || gContext == nullptr) return;
  const auto& data = *static_cast<const CUpti_CallbackData*>(callbackData);
  if (data.callbackSite == CUPTI_API_EXIT) {
    Residency::takeStrictOverrun();  // the call is done: no interposer of it is still to come
    // The runtime launch returns without the driver launch it was expected to make.
    if (tUnknownStub != nullptr && data.correlationId == tUnknownStubCorrelation &&
        domain == CUPTI_CB_DOMAIN_RUNTIME_API && tUnknownStubDepth == tProgramCallDepth)
      tUnknownStub = nullptr;
    // The work is in its stream now: its buffers may be evicted again (after it).
    if (!tOpenCalls.empty() && tOpenCalls.back().correlation == data.correlationId &&
        tOpenCalls.back().domain == domain && tOpenCalls.back().cbid == cbid &&
        tOpenCalls.back().programCallDepth == tProgramCallDepth) {
      tOpenCalls.pop_back();
      gContext->residency->releaseHeld();
    }
    return;
  }
  if (data.callbackSite != CUPTI_API_ENTER) return;
  Route route;
  if (domain == CUPTI_CB_DOMAIN_DRIVER_API && cbid < CUPTI_DRIVER_TRACE_CBID_SIZE)
    route = gDriverRoutes[cbid];
  else if (domain == CUPTI_CB_DOMAIN_RUNTIME_API && cbid < CUPTI_RUNTIME_TRACE_CBID_SIZE)
    route = gRuntimeRoutes[cbid];
  if (route.work == Work::kIgnore) return;
  if (tUnknownStub != nullptr &&
      (route.work == Work::kDriverLaunch || route.work == Work::kDriverLaunchEx ||
       route.work == Work::kDriverCooperative) &&
      tUnknownStubDepth == tProgramCallDepth &&
      (tUnknownStubCorrelation == 0 || tUnknownStubCorrelation == data.correlationId)) {
    // The function of the launch the runtime level could not name.
    const void* p = data.functionParams;
    const CUfunction f = route.work == Work::kDriverLaunchEx
                             ? as<cuLaunchKernelEx_params>(p).f
                             : route.work == Work::kDriverCooperative
                                   ? as<cuLaunchCooperativeKernel_params>(p).f
                                   : as<cuLaunchKernel_params>(p).f;
    if (f != nullptr) learnFunction(tUnknownStub, f, data.symbolName);
    tUnknownStub = nullptr;
  }
  // A launch interposer already prepared this call (and this is one of its callbacks).
  if (tPreparedByInterposer) return;
  // The driver calls a runtime call makes carry its correlation id: handled once.
  if (data.correlationId != 0 && !tOpenCalls.empty() &&
      tOpenCalls.back().correlation == data.correlationId &&
      tOpenCalls.back().programCallDepth == tProgramCallDepth)
    return;
  tOpenCalls.push_back(OpenCall{data.correlationId, domain, cbid, tProgramCallDepth});
  handle(route.work, route.perThread, data, domain, cbid);
}

// Where libcupti may be, in order.
std::vector<std::string> cuptiCandidates(const std::string& configured) {
  std::vector<std::string> paths;
  if (!configured.empty()) {
    paths.push_back(configured);
    return paths;
  }
  // Beside the CUDA runtime the program loaded (a wheel's or the toolkit's).
  Dl_info info;
  void* runtimeSymbol = realDlsym()(RTLD_DEFAULT, "cudaGetDeviceCount");
  if (runtimeSymbol != nullptr && dladdr(runtimeSymbol, &info) != 0 && info.dli_fname) {
    std::string dir = info.dli_fname;
    dir.resize(dir.find_last_of('/') + 1);
    paths.push_back(dir + "libcupti.so.13");
    // pip layout: nvidia/cuda_runtime/lib beside nvidia/cuda_cupti/lib
    auto nvidia = dir.rfind("/cuda_runtime/lib/");
    if (nvidia != std::string::npos)
      paths.push_back(dir.substr(0, nvidia) + "/cuda_cupti/lib/libcupti.so.13");
  }
  paths.push_back("libcupti.so.13");  // the loader's search path
  paths.push_back("/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13");
  paths.push_back("/usr/local/cuda/lib64/libcupti.so.13");
  return paths;
}

}  // namespace

namespace {

CUresult prepareLaunch(LaunchTarget target, CUstream stream, bool perThread, void** params,
                       void** extra) {
  const char* name = nullptr;
  if (target) {
    ReentryGuard guard;
    name = targetName(*gContext->api, target);
  }
  CUresult result = launch(target, stream, perThread, params, extra, name, nullptr, nullptr, true);
  // Strict: the runtime call this driver launch belongs to was prepared over the budget by its
  // CUPTI callback, which could not fail it; this interposer can.
  if (result == CUDA_SUCCESS && Residency::takeStrictOverrun()) result = CUDA_ERROR_OUT_OF_MEMORY;
  if (result != CUDA_SUCCESS) gContext->residency->releaseHeld();  // no scope will follow
  return result;
}

}  // namespace

CUresult prepareKernelLaunch(CUfunction function, CUstream stream, bool perThread,
                             void** params, void** extra) {
  if (gContext == nullptr) return CUDA_SUCCESS;
  return prepareLaunch(LaunchTarget::function(function), stream, perThread, params, extra);
}

CUresult prepareRuntimeLaunch(const void* symbol, CUstream stream, bool perThread, void** args) {
  if (gContext == nullptr) return CUDA_SUCCESS;
  const LaunchTarget target = targetForSymbol(symbol);
  const CUresult result = prepareLaunch(target, stream, perThread, args, nullptr);
  // The launch follows at once, in the interposer's PreparedLaunchScope, which forgets this.
  if (!target && result == CUDA_SUCCESS) expectDriverLaunch(symbol, 0);
  return result;
}

bool launchAlreadyPrepared() { return tPreparedByInterposer; }

void detachCupti() { gContext = nullptr; }

PreparedLaunchScope::PreparedLaunchScope() : outer_(tPreparedByInterposer) {
  tPreparedByInterposer = true;
}
PreparedLaunchScope::~PreparedLaunchScope() {
  tPreparedByInterposer = outer_;
  tUnknownStub = nullptr;  // the launch is made: whatever it did not name stays unknown
  if (gContext != nullptr) gContext->residency->releaseHeld();
}

CuptiStatus subscribeCupti(const std::string& cuptiPath, const DriverApi& api,
                           Residency& residency) {
  CuptiStatus status;
  void* library = nullptr;
  std::string tried;
  for (const std::string& path : cuptiCandidates(cuptiPath)) {
    library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) break;
    tried += tried.empty() ? path : ", " + path;
  }
  if (library == nullptr) {
    status.message = "cannot load CUPTI (tried " + tried + "); set DELTA_CUPTI_PATH to libcupti.so";
    return status;
  }
  auto lookup = [&](const char* name) { return realDlsym()(library, name); };
  auto subscribeV2 = reinterpret_cast<decltype(&cuptiSubscribe_v2)>(lookup("cuptiSubscribe_v2"));
  auto subscribeV1 = reinterpret_cast<decltype(&cuptiSubscribe)>(lookup("cuptiSubscribe"));
  auto enableCallback = reinterpret_cast<decltype(&cuptiEnableCallback)>(lookup("cuptiEnableCallback"));
  auto resultString = reinterpret_cast<decltype(&cuptiGetResultString)>(lookup("cuptiGetResultString"));
  if ((subscribeV2 == nullptr && subscribeV1 == nullptr) || enableCallback == nullptr) {
    status.message = "the CUPTI library found lacks the callback API";
    return status;
  }
  static Context context;
  context.api = &api;
  context.residency = &residency;
  context.getFuncBySymbol = runtimeApi().cudaGetFuncBySymbol;
  context.generation = gContextGenerations.fetch_add(1) + 1;
  buildRoutes();
  gContext = &context;

  CUpti_SubscriberHandle subscriber = nullptr;
  CUptiResult result;
  char holder[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN + 64] = "";
  if (subscribeV2 != nullptr) {
    CUpti_SubscriberParams params{};
    params.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
    params.subscriberName = "DELTA";
    params.oldSubscriberName = holder;
    params.oldSubscriberSize = sizeof holder;
    result = subscribeV2(&subscriber, onCallback, nullptr, &params);
  } else {
    result = subscribeV1(&subscriber, onCallback, nullptr);
  }
  if (result != CUPTI_SUCCESS) {
    gContext = nullptr;
    const char* text = "unknown error";
    if (resultString) resultString(result, &text);
    if (result == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
      status.message = std::string("CUPTI is already in use by ") +
                       (holder[0] ? holder : "another tool (Nsight, compute-sanitizer, a profiler)") +
                       ": libdelta cannot see kernel launches, so it will not evict anything "
                       "(pass-through mode)";
    else
      status.message = std::string("cannot subscribe to CUPTI: ") + text +
                       " (pass-through mode)";
    return status;
  }
  // Every callback or none: a launch the shim does not see may touch an evicted buffer.
  auto unsubscribe = reinterpret_cast<decltype(&cuptiUnsubscribe)>(lookup("cuptiUnsubscribe"));
  CUptiResult enabled = CUPTI_SUCCESS;
  for (CUpti_CallbackId id = 0; id < CUPTI_DRIVER_TRACE_CBID_SIZE && enabled == CUPTI_SUCCESS; ++id)
    if (gDriverRoutes[id].work != Work::kIgnore)
      enabled = enableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, id);
  for (CUpti_CallbackId id = 0; id < CUPTI_RUNTIME_TRACE_CBID_SIZE && enabled == CUPTI_SUCCESS; ++id)
    if (gRuntimeRoutes[id].work != Work::kIgnore)
      enabled = enableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, id);
  if (enabled != CUPTI_SUCCESS) {
    if (unsubscribe) unsubscribe(subscriber);
    gContext = nullptr;
    const char* text = "unknown error";
    if (resultString) resultString(enabled, &text);
    status.message = std::string("cannot enable CUPTI callbacks: ") + text +
                     ": libdelta cannot see kernel launches, so it will not evict anything "
                     "(pass-through mode)";
    return status;
  }
  status.subscribed = true;
  return status;
}

}  // namespace delta::shim
