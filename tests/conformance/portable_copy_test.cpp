/* Copies and memsets, synchronous and asynchronous: results, and when the host memory is
 * read or written (pinned sources are read when the copy executes; pageable sources are
 * captured at the call; copies to pageable memory return only when done; synchronous
 * copies wait for earlier work on the legacy default stream). Real CUDA API only. */
#include <cstring>
#include <thread>
#include <vector>

#include "conformance_util.h"

namespace conformance {
namespace {

class Copies : public DriverTest {
 protected:
  void SetUp() override {
    DriverTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_CU(cuMemAlloc(&d_, kBytes));
    ASSERT_CU(cuStreamCreate(&s_, CU_STREAM_NON_BLOCKING));
  }
  void TearDown() override {
    gate_.Open();
    EXPECT_FALSE(gate_.timed_out());
    if (s_ != nullptr) {
      EXPECT_CU(cuStreamSynchronize(s_));
      EXPECT_CU(cuStreamDestroy(s_));
    }
    if (d_ != 0) {
      EXPECT_CU(cuMemFree(d_));
    }
    DriverTest::TearDown();
  }
  std::vector<unsigned char> Read(CUdeviceptr p, size_t n) {
    std::vector<unsigned char> v(n);
    EXPECT_CU(cuMemcpyDtoH(v.data(), p, n));
    return v;
  }
  static constexpr size_t kBytes = 1 << 16;
  CUdeviceptr d_ = 0;
  CUstream s_ = nullptr;
  Gate gate_;
};

TEST_F(Copies, SyncHtoDDtoHDtoDRoundTrip) {
  std::vector<unsigned char> in(kBytes);
  for (size_t i = 0; i < kBytes; ++i) in[i] = static_cast<unsigned char>(i * 13 + 1);
  ASSERT_CU(cuMemcpyHtoD(d_, in.data(), kBytes));
  CUdeviceptr d2 = 0;
  ASSERT_CU(cuMemAlloc(&d2, kBytes));
  ASSERT_CU(cuMemcpyDtoD(d2, d_, kBytes));
  EXPECT_EQ(Read(d2, kBytes), in);
  ASSERT_CU(cuMemFree(d2));
}

TEST_F(Copies, UnifiedMemcpyCopiesDeviceToDevice) {
  ASSERT_CU(cuMemsetD8(d_, 0x3c, kBytes));
  CUdeviceptr d2 = 0;
  ASSERT_CU(cuMemAlloc(&d2, kBytes));
  ASSERT_CU(cuMemcpy(d2, d_, kBytes));
  EXPECT_EQ(Read(d2, 1)[0], 0x3c);
  ASSERT_CU(cuMemsetD8(d2, 0x4d, kBytes));
  ASSERT_CU(cuCtxSynchronize());  // a memset may return before it is done
  ASSERT_CU(cuMemcpyAsync(d_, d2, kBytes, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(Read(d_, kBytes)[kBytes - 1], 0x4d);
  ASSERT_CU(cuMemFree(d2));
}

TEST_F(Copies, CopyAtAnOffsetTouchesOnlyThatRange) {
  ASSERT_CU(cuMemsetD8(d_, 0, kBytes));
  unsigned char buf[100];
  std::memset(buf, 0xee, sizeof buf);
  ASSERT_CU(cuMemcpyHtoD(d_ + 1000, buf, sizeof buf));
  auto v = Read(d_, kBytes);
  EXPECT_EQ(v[999], 0);
  EXPECT_EQ(v[1000], 0xee);
  EXPECT_EQ(v[1099], 0xee);
  EXPECT_EQ(v[1100], 0);
}

TEST_F(Copies, MemsetWidths) {
  ASSERT_CU(cuMemsetD8(d_, 0xab, 16));
  ASSERT_CU(cuMemsetD16(d_ + 16, 0x1234, 8));
  ASSERT_CU(cuMemsetD32(d_ + 32, 0xcafef00d, 4));
  auto v = Read(d_, 48);
  EXPECT_EQ(v[15], 0xab);
  uint16_t h;
  std::memcpy(&h, &v[16 + 14], 2);
  EXPECT_EQ(h, 0x1234);
  uint32_t w;
  std::memcpy(&w, &v[32 + 12], 4);
  EXPECT_EQ(w, 0xcafef00du);
}

TEST_F(Copies, AsyncMemsetWidths) {
  ASSERT_CU(cuMemsetD8Async(d_, 0xab, 16, s_));
  ASSERT_CU(cuMemsetD16Async(d_ + 16, 0x1234, 8, s_));
  ASSERT_CU(cuMemsetD32Async(d_ + 32, 0xcafef00d, 4, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  auto v = Read(d_, 48);
  EXPECT_EQ(v[0], 0xab);
  uint16_t h;
  std::memcpy(&h, &v[16], 2);
  EXPECT_EQ(h, 0x1234);
  uint32_t w;
  std::memcpy(&w, &v[32], 4);
  EXPECT_EQ(w, 0xcafef00du);
}

TEST_F(Copies, AsyncHtoDFromPinnedReadsSourceWhenExecuted) {
  PinnedBuffer src(4096);
  ASSERT_TRUE(src.ok());
  std::memset(src.data(), 0x11, 4096);
  ASSERT_CU(cuLaunchHostFunc(s_, Gate::BlockHostFn, &gate_));
  ASSERT_CU(cuMemcpyHtoDAsync(d_, src.data(), 4096, s_));
  std::memset(src.data(), 0x22, 4096);  // before the copy executes
  gate_.Open();
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(Read(d_, 4096)[4095], 0x22);
}

TEST_F(Copies, AsyncHtoDFromPageableCapturesSourceAtCall) {
  std::vector<unsigned char> src(4096, 0x11);
  ASSERT_CU(cuLaunchHostFunc(s_, Gate::BlockHostFn, &gate_));
  ASSERT_CU(cuMemcpyHtoDAsync(d_, src.data(), 4096, s_));
  std::memset(src.data(), 0x22, 4096);
  gate_.Open();
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(Read(d_, 4096)[4095], 0x11);
}

TEST_F(Copies, AsyncDtoHToPinnedWritesLate) {
  ASSERT_CU(cuMemsetD8(d_, 0x5e, 4096));
  ASSERT_CU(cuCtxSynchronize());  // a memset may return before it is done
  PinnedBuffer dst(4096);
  ASSERT_TRUE(dst.ok());
  std::memset(dst.data(), 0, 4096);
  ASSERT_CU(cuLaunchHostFunc(s_, Gate::BlockHostFn, &gate_));
  ASSERT_CU(cuMemcpyDtoHAsync(dst.data(), d_, 4096, s_));
  EXPECT_EQ(dst.data()[0], 0) << "the copy ran before earlier work in its stream";
  gate_.Open();
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(dst.data()[0], 0x5e);
}

TEST_F(Copies, AsyncDtoHToPageableReturnsOnlyWhenDone) {
  ASSERT_CU(cuMemsetD8(d_, 0, 4096));
  ASSERT_CU(cuCtxSynchronize());  // a memset may return before it is done
  ASSERT_CU(cuLaunchHostFunc(s_, Gate::BlockHostFn, &gate_));
  ASSERT_CU(cuMemsetD8Async(d_, 0x77, 4096, s_));
  std::vector<unsigned char> dst(4096, 0);
  std::thread opener([&] {
    std::this_thread::sleep_for(kNegativeWait);
    gate_.Open();
  });
  ASSERT_CU(cuMemcpyDtoHAsync(dst.data(), d_, 4096, s_));
  EXPECT_EQ(dst[0], 0x77) << "DtoH to pageable memory returned before the copy was done";
  EXPECT_EQ(dst[4095], 0x77);
  opener.join();
}

TEST_F(Copies, SyncCopyWaitsForEarlierWorkInBlockingStreams) {
  CUstream blocking = nullptr;
  ASSERT_CU(cuStreamCreate(&blocking, 0));
  ASSERT_CU(cuMemsetD8(d_, 0, 4096));
  ASSERT_CU(cuLaunchHostFunc(blocking, Gate::BlockHostFn, &gate_));
  ASSERT_CU(cuMemsetD8Async(d_, 0x66, 4096, blocking));
  std::thread opener([&] {
    std::this_thread::sleep_for(kNegativeWait);
    gate_.Open();
  });
  std::vector<unsigned char> dst(4096, 0);
  ASSERT_CU(cuMemcpyDtoH(dst.data(), d_, 4096));  // legacy default stream
  EXPECT_EQ(dst[0], 0x66);
  opener.join();
  ASSERT_CU(cuStreamDestroy(blocking));
}

TEST_F(Copies, AsyncCopiesOnTheLegacyStreamWork) {
  PinnedBuffer host(4096);
  ASSERT_TRUE(host.ok());
  std::memset(host.data(), 0x42, 4096);
  ASSERT_CU(cuMemcpyHtoDAsync(d_, host.data(), 4096, nullptr));
  ASSERT_CU(cuMemsetD32Async(d_ + 4096, 0x01020304, 1024, nullptr));
  ASSERT_CU(cuStreamSynchronize(nullptr));
  std::memset(host.data(), 0, 4096);  // only now: the pinned source is read when the copy runs
  ASSERT_CU(cuMemcpyDtoHAsync(host.data(), d_ + 4092, 8, CU_STREAM_LEGACY));
  ASSERT_CU(cuStreamSynchronize(CU_STREAM_LEGACY));
  EXPECT_EQ(host.data()[0], 0x42);
  EXPECT_EQ(host.data()[4], 0x04);
}

}  // namespace
}  // namespace conformance
