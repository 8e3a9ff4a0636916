/* The per-thread default stream through the _ptsz/_ptds API variants: this file is
 * compiled as `nvcc --default-stream per-thread` code is, with
 * CUDA_API_PER_THREAD_DEFAULT_STREAM defined, so stream 0 and the synchronous copies use the
 * calling thread's default stream. Real CUDA API only. */
#define CUDA_API_PER_THREAD_DEFAULT_STREAM 1

#include <dlfcn.h>

#include <cstring>
#include <thread>

#include "conformance_util.h"

namespace conformance {
namespace {

class PerThreadApi : public DriverTest {
 protected:
  void TearDown() override {
    gate_.Open();
    hold_.Close();
    EXPECT_FALSE(gate_.timed_out());
    DriverTest::TearDown();
  }
  Gate gate_;
  StreamGate hold_;  // the device waits; see conformance_util.h
  OrderLog log_;
};

TEST_F(PerThreadApi, StreamZeroDoesNotSerializeWithBlockingStreams) {
  CUstream a;
  ASSERT_CU(cuStreamCreate(&a, 0));
  ASSERT_CU(hold_.Hold(CU_STREAM_PER_THREAD));  // this thread's stream 0
  Marker m{&log_, "a"};
  ASSERT_CU(cuLaunchHostFunc(a, Marker::HostFn, &m));
  EXPECT_TRUE(log_.WaitFor("a", kPositiveWait))
      << "stream 0 acted as the legacy default stream in per-thread mode";
  hold_.Open();
  ASSERT_CU(cuStreamSynchronize(nullptr));  // cuStreamSynchronize_ptsz
  ASSERT_CU(cuStreamDestroy(a));
}

TEST_F(PerThreadApi, AsyncCopyOnStreamZeroIsOrderedAfterEarlierPerThreadWork) {
  CUdeviceptr d;
  ASSERT_CU(cuMemAlloc(&d, 4096));
  PinnedBuffer src(4096);
  ASSERT_TRUE(src.ok());
  std::memset(src.data(), 1, 4096);
  ASSERT_CU(cuLaunchHostFunc(nullptr, Gate::BlockHostFn, &gate_));
  ASSERT_CU(cuMemcpyHtoDAsync(d, src.data(), 4096, nullptr));  // cuMemcpyHtoDAsync_v2_ptsz
  std::memset(src.data(), 2, 4096);
  EXPECT_CU_EQ(CUDA_ERROR_NOT_READY, cuStreamQuery(nullptr));  // cuStreamQuery_ptsz
  gate_.Open();
  ASSERT_CU(cuStreamSynchronize(nullptr));
  unsigned char b = 0;
  ASSERT_CU(cuMemcpyDtoH(&b, d, 1));  // cuMemcpyDtoH_v2_ptds
  EXPECT_EQ(b, 2);
  ASSERT_CU(cuMemFree(d));
}

TEST_F(PerThreadApi, SyncCopyUsesThisThreadsStream) {
  // A synchronous _ptds copy waits for this thread's stream only, not for another thread's.
  CUdeviceptr d;
  ASSERT_CU(cuMemAlloc(&d, 4096));
  ASSERT_CU(cuMemsetD8(d, 9, 4096));  // cuMemsetD8_v2_ptds
  CUresult r = CUDA_ERROR_UNKNOWN;
  std::thread t([&] {
    r = cuCtxSetCurrent(ctx_);
    if (r == CUDA_SUCCESS) r = cuLaunchHostFunc(nullptr, Gate::BlockHostFn, &gate_);
  });
  t.join();
  ASSERT_CU(r);
  unsigned char b = 0;
  ASSERT_CU(cuMemcpyDtoH(&b, d, 1));  // must not wait for the other thread's blocked stream
  EXPECT_EQ(b, 9);
  gate_.Open();
  ASSERT_CU(cuCtxSynchronize());
  ASSERT_CU(cuMemFree(d));
}

TEST_F(PerThreadApi, ExplicitLegacyStreamStillWaitsForPerThreadWork) {
  GatedMarker gp{&gate_, &log_, "ptds"};
  ASSERT_CU(cuLaunchHostFunc(nullptr, GatedMarker::HostFn, &gp));
  Marker m{&log_, "legacy"};
  ASSERT_CU(cuLaunchHostFunc(CU_STREAM_LEGACY, Marker::HostFn, &m));
  EXPECT_FALSE(log_.WaitFor("legacy", kNegativeWait));
  gate_.Open();
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(log_.Marks(), (std::vector<std::string>{"ptds", "legacy"}));
}

// The runtime's _ptsz/_ptds entry points are looked up by name rather than linked, so a
// runtime that lacks them fails this test instead of breaking the whole binary's link.
template <typename Fn>
Fn RuntimeEntry(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

TEST_F(PerThreadApi, RuntimeStreamZeroIsPerThread) {
  auto launch_host = RuntimeEntry<cudaError_t (*)(cudaStream_t, cudaHostFn_t, void*)>(
      "cudaLaunchHostFunc_ptsz");
  auto memset_async = RuntimeEntry<cudaError_t (*)(void*, int, size_t, cudaStream_t)>(
      "cudaMemsetAsync_ptsz");
  auto stream_query = RuntimeEntry<cudaError_t (*)(cudaStream_t)>("cudaStreamQuery_ptsz");
  auto stream_sync = RuntimeEntry<cudaError_t (*)(cudaStream_t)>("cudaStreamSynchronize_ptsz");
  auto memcpy_ptds =
      RuntimeEntry<cudaError_t (*)(void*, const void*, size_t, cudaMemcpyKind)>("cudaMemcpy_ptds");
  ASSERT_NE(launch_host, nullptr) << "libcudart lacks cudaLaunchHostFunc_ptsz";
  ASSERT_NE(memset_async, nullptr) << "libcudart lacks cudaMemsetAsync_ptsz";
  ASSERT_NE(stream_query, nullptr) << "libcudart lacks cudaStreamQuery_ptsz";
  ASSERT_NE(stream_sync, nullptr) << "libcudart lacks cudaStreamSynchronize_ptsz";
  ASSERT_NE(memcpy_ptds, nullptr) << "libcudart lacks cudaMemcpy_ptds";
  ASSERT_RT(cudaSetDevice(0));
  void* d = nullptr;
  ASSERT_RT(cudaMalloc(&d, 4096));
  cudaStream_t a;
  ASSERT_RT(cudaStreamCreate(&a));
  ASSERT_CU(hold_.Hold(CU_STREAM_PER_THREAD));  // the runtime's stream 0 in this mode
  Marker m{&log_, "a"};
  ASSERT_RT(launch_host(a, Marker::HostFn, &m));  // stream a is not stream 0's successor
  EXPECT_TRUE(log_.WaitFor("a", kPositiveWait));
  ASSERT_RT(memset_async(d, 3, 4096, nullptr));
  EXPECT_RT_EQ(cudaErrorNotReady, stream_query(nullptr));
  hold_.Open();
  ASSERT_RT(stream_sync(nullptr));
  unsigned char b = 0;
  ASSERT_RT(memcpy_ptds(&b, d, 1, cudaMemcpyDeviceToHost));
  EXPECT_EQ(b, 3);
  ASSERT_RT(cudaStreamDestroy(a));
  ASSERT_RT(cudaFree(d));
}

}  // namespace
}  // namespace conformance
