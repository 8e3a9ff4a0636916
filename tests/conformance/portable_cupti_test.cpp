/* CUPTI callbacks on driver and runtime calls: ids, names, parameter structs, return
 * values, correlation, calling thread, nested calls, enable switches, the single-subscriber
 * rule. Real CUDA/CUPTI API only (runtime-internal driver callbacks are platform tests). */
#include <cupti.h>

#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "conformance_util.h"

namespace conformance {
namespace {

struct Record {
  CUpti_CallbackDomain domain;
  CUpti_CallbackId cbid;
  CUpti_ApiCallbackSite site;
  std::string function;
  uint32_t correlation;
  uint64_t correlation_data;  // at exit: what enter stored
  std::thread::id thread;
  CUresult cu_result;          // driver exit
  cudaError_t rt_result;       // runtime exit
  size_t alloc_bytes = 0;      // cuMemAlloc_v2 / cudaMalloc size
  uint64_t alloc_ptr = 0;      // at exit: *dptr
  size_t copy_bytes = 0;       // cuMemcpyHtoD(Async)_v2 ByteCount
  const void* copy_src = nullptr;
};

struct Recorder {
  std::mutex mutex;
  std::vector<Record> records;
  bool nest = false;  // call cuCtxGetCurrent from inside the cuMemAlloc_v2 enter callback

  std::vector<Record> Take() {
    std::lock_guard<std::mutex> lock(mutex);
    return std::move(records);
  }
};

thread_local bool t_in_nested = false;

void CUPTIAPI OnCallback(void* userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                         const void* data) {
  auto* rec = static_cast<Recorder*>(userdata);
  if (domain != CUPTI_CB_DOMAIN_DRIVER_API && domain != CUPTI_CB_DOMAIN_RUNTIME_API) return;
  const auto* cb = static_cast<const CUpti_CallbackData*>(data);
  Record r{};
  r.domain = domain;
  r.cbid = cbid;
  r.site = cb->callbackSite;
  r.function = cb->functionName ? cb->functionName : "";
  r.correlation = cb->correlationId;
  r.thread = std::this_thread::get_id();
  if (cb->correlationData != nullptr) {
    if (cb->callbackSite == CUPTI_API_ENTER) {
      *cb->correlationData = 0xC0FFEE00u + cbid;
    } else {
      r.correlation_data = *cb->correlationData;
    }
  }
  if (domain == CUPTI_CB_DOMAIN_DRIVER_API) {
    if (cb->callbackSite == CUPTI_API_EXIT && cb->functionReturnValue)
      r.cu_result = *static_cast<const CUresult*>(cb->functionReturnValue);
    if (cbid == CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2 && cb->functionParams) {
      const auto* p = static_cast<const cuMemAlloc_v2_params*>(cb->functionParams);
      r.alloc_bytes = p->bytesize;
      if (cb->callbackSite == CUPTI_API_EXIT && p->dptr) r.alloc_ptr = *p->dptr;
    }
    if (cbid == CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2 && cb->functionParams) {
      const auto* p = static_cast<const cuMemcpyHtoDAsync_v2_params*>(cb->functionParams);
      r.copy_bytes = p->ByteCount;
      r.copy_src = p->srcHost;
    }
    if (cbid == CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2 && cb->functionParams) {
      const auto* p = static_cast<const cuMemcpyHtoD_v2_params*>(cb->functionParams);
      r.copy_bytes = p->ByteCount;
      r.copy_src = p->srcHost;
    }
  } else {
    if (cb->callbackSite == CUPTI_API_EXIT && cb->functionReturnValue)
      r.rt_result = *static_cast<const cudaError_t*>(cb->functionReturnValue);
    if (cbid == CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020 && cb->functionParams) {
      const auto* p = static_cast<const cudaMalloc_v3020_params*>(cb->functionParams);
      r.alloc_bytes = p->size;
      if (cb->callbackSite == CUPTI_API_EXIT && p->devPtr)
        r.alloc_ptr = reinterpret_cast<uint64_t>(*p->devPtr);
    }
  }
  {
    std::lock_guard<std::mutex> lock(rec->mutex);
    rec->records.push_back(r);
  }
  if (rec->nest && !t_in_nested && cbid == CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2 &&
      cb->callbackSite == CUPTI_API_ENTER) {
    t_in_nested = true;
    CUcontext c;
    cuCtxGetCurrent(&c);
    t_in_nested = false;
  }
}

class Cupti : public DriverTest {
 protected:
  void SetUp() override {
    DriverTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_EQ(CUPTI_SUCCESS, cuptiSubscribe(&sub_, OnCallback, &rec_));
    subscribed_ = true;
  }
  void TearDown() override {
    if (subscribed_) {
      EXPECT_EQ(CUPTI_SUCCESS, cuptiUnsubscribe(sub_));
    }
    DriverTest::TearDown();
  }
  static std::vector<Record> Select(const std::vector<Record>& all, CUpti_CallbackDomain d,
                                    CUpti_CallbackId id) {
    std::vector<Record> out;
    for (const auto& r : all)
      if (r.domain == d && r.cbid == id) out.push_back(r);
    return out;
  }
  CUpti_SubscriberHandle sub_ = nullptr;
  bool subscribed_ = false;
  Recorder rec_;
};

TEST_F(Cupti, DriverCallRaisesEnterAndExitWithParamsAndResult) {
  ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableDomain(1, sub_, CUPTI_CB_DOMAIN_DRIVER_API));
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAlloc(&p, 12345));
  ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableDomain(0, sub_, CUPTI_CB_DOMAIN_DRIVER_API));
  auto recs = Select(rec_.Take(), CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].site, CUPTI_API_ENTER);
  EXPECT_EQ(recs[1].site, CUPTI_API_EXIT);
  EXPECT_EQ(recs[0].function, "cuMemAlloc_v2");
  EXPECT_EQ(recs[1].function, "cuMemAlloc_v2");
  EXPECT_EQ(recs[0].alloc_bytes, 12345u);
  EXPECT_EQ(recs[1].alloc_ptr, p);
  EXPECT_EQ(recs[1].cu_result, CUDA_SUCCESS);
  EXPECT_EQ(recs[0].correlation, recs[1].correlation);
  EXPECT_NE(recs[0].correlation, 0u);
  EXPECT_EQ(recs[1].correlation_data, 0xC0FFEE00u + CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2);
  EXPECT_EQ(recs[0].thread, std::this_thread::get_id());
  EXPECT_EQ(recs[1].thread, std::this_thread::get_id());
  ASSERT_CU(cuMemFree(p));
}

TEST_F(Cupti, FailingCallReportsItsErrorAtExit) {
  ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableDomain(1, sub_, CUPTI_CB_DOMAIN_DRIVER_API));
  int x = 0;
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemFree(reinterpret_cast<CUdeviceptr>(&x)));
  ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableDomain(0, sub_, CUPTI_CB_DOMAIN_DRIVER_API));
  auto recs = Select(rec_.Take(), CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[1].cu_result, CUDA_ERROR_INVALID_VALUE);
}

TEST_F(Cupti, CopiesCarryTheirParamStructs) {
  ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableDomain(1, sub_, CUPTI_CB_DOMAIN_DRIVER_API));
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, 8192));
  std::vector<unsigned char> h(8192, 1);
  ASSERT_CU(cuMemcpyHtoD(d, h.data(), 8000));
  ASSERT_CU(cuMemcpyHtoDAsync(d, h.data(), 4000, nullptr));
  ASSERT_CU(cuStreamSynchronize(nullptr));
  ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableDomain(0, sub_, CUPTI_CB_DOMAIN_DRIVER_API));
  auto all = rec_.Take();
  auto sync = Select(all, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2);
  auto async =
      Select(all, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2);
  ASSERT_EQ(sync.size(), 2u);
  ASSERT_EQ(async.size(), 2u);
  EXPECT_EQ(sync[0].function, "cuMemcpyHtoD_v2");
  EXPECT_EQ(sync[0].copy_bytes, 8000u);
  EXPECT_EQ(sync[0].copy_src, h.data());
  EXPECT_EQ(async[0].function, "cuMemcpyHtoDAsync_v2");
  EXPECT_EQ(async[0].copy_bytes, 4000u);
  EXPECT_NE(sync[0].correlation, async[0].correlation);
  ASSERT_CU(cuMemFree(d));
}

TEST_F(Cupti, EnableCallbackSelectsOneId) {
  ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableCallback(1, sub_, CUPTI_CB_DOMAIN_DRIVER_API,
                                               CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2));
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, 4096));
  ASSERT_CU(cuMemFree(d));
  ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableCallback(0, sub_, CUPTI_CB_DOMAIN_DRIVER_API,
                                               CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2));
  auto all = rec_.Take();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].cbid, static_cast<CUpti_CallbackId>(CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2));
  ASSERT_CU(cuMemAlloc(&d, 4096));
  ASSERT_CU(cuMemFree(d));
  EXPECT_TRUE(rec_.Take().empty()) << "callbacks after disabling";
}

TEST_F(Cupti, CallbacksRunOnTheCallingThread) {
  ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableDomain(1, sub_, CUPTI_CB_DOMAIN_DRIVER_API));
  std::thread::id tid;
  CUresult r = CUDA_ERROR_UNKNOWN;
  std::thread t([&] {
    tid = std::this_thread::get_id();
    r = cuCtxSetCurrent(ctx_);
    CUdeviceptr d = 0;
    if (r == CUDA_SUCCESS) r = cuMemAlloc(&d, 4096);
    if (r == CUDA_SUCCESS) r = cuMemFree(d);
  });
  t.join();
  ASSERT_CU(r);
  ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableDomain(0, sub_, CUPTI_CB_DOMAIN_DRIVER_API));
  auto recs = Select(rec_.Take(), CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].thread, tid);
  EXPECT_EQ(recs[1].thread, tid);
}

TEST_F(Cupti, CallsFromInsideACallbackRaiseCallbacks) {
  rec_.nest = true;
  ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableDomain(1, sub_, CUPTI_CB_DOMAIN_DRIVER_API));
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, 4096));
  ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableDomain(0, sub_, CUPTI_CB_DOMAIN_DRIVER_API));
  rec_.nest = false;
  auto all = rec_.Take();
  // Expected: alloc enter, (nested) ctxGetCurrent enter+exit, alloc exit.
  ASSERT_GE(all.size(), 4u);
  EXPECT_EQ(all[0].cbid, static_cast<CUpti_CallbackId>(CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2));
  EXPECT_EQ(all[1].cbid, static_cast<CUpti_CallbackId>(CUPTI_DRIVER_TRACE_CBID_cuCtxGetCurrent));
  EXPECT_EQ(all[1].site, CUPTI_API_ENTER);
  EXPECT_EQ(all[2].cbid, static_cast<CUpti_CallbackId>(CUPTI_DRIVER_TRACE_CBID_cuCtxGetCurrent));
  EXPECT_EQ(all[2].site, CUPTI_API_EXIT);
  // A call made inside another call's callback carries that call's correlation id (real CUPTI,
  // seen on an H200 with driver 580).
  EXPECT_EQ(all[1].correlation, all[0].correlation);
  EXPECT_EQ(all.back().cbid, static_cast<CUpti_CallbackId>(CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2));
  EXPECT_EQ(all.back().site, CUPTI_API_EXIT);
  EXPECT_EQ(all.back().correlation, all[0].correlation);
  ASSERT_CU(cuMemFree(d));
}

TEST_F(Cupti, RuntimeCallRaisesRuntimeCallback) {
  ASSERT_RT(cudaSetDevice(0));
  ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableDomain(1, sub_, CUPTI_CB_DOMAIN_RUNTIME_API));
  void* p = nullptr;
  ASSERT_RT(cudaMalloc(&p, 54321));
  ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableDomain(0, sub_, CUPTI_CB_DOMAIN_RUNTIME_API));
  auto recs =
      Select(rec_.Take(), CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020);
  ASSERT_EQ(recs.size(), 2u);
  // The runtime's functionName is the plain name, without the version its callback id carries
  // (seen on an H200).
  EXPECT_EQ(recs[0].function, "cudaMalloc");
  EXPECT_EQ(recs[0].site, CUPTI_API_ENTER);
  EXPECT_EQ(recs[1].site, CUPTI_API_EXIT);
  EXPECT_EQ(recs[0].alloc_bytes, 54321u);
  EXPECT_EQ(recs[1].alloc_ptr, reinterpret_cast<uint64_t>(p));
  EXPECT_EQ(recs[1].rt_result, cudaSuccess);
  EXPECT_EQ(recs[0].correlation, recs[1].correlation);
  EXPECT_EQ(recs[1].correlation_data, 0xC0FFEE00u + CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020);
  ASSERT_RT(cudaFree(p));
}

TEST_F(Cupti, RuntimeCopyAndLaunchHostFuncIds) {
  ASSERT_RT(cudaSetDevice(0));
  ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableDomain(1, sub_, CUPTI_CB_DOMAIN_RUNTIME_API));
  void* d = nullptr;
  ASSERT_RT(cudaMalloc(&d, 4096));
  char h[64] = {};
  ASSERT_RT(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice));
  ASSERT_RT(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, nullptr));
  ASSERT_RT(cudaMemset(d, 0, 64));
  OrderLog log;
  Marker m{&log, "x"};
  ASSERT_RT(cudaLaunchHostFunc(nullptr, Marker::HostFn, &m));
  ASSERT_RT(cudaDeviceSynchronize());
  ASSERT_RT(cudaFree(d));
  ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableDomain(0, sub_, CUPTI_CB_DOMAIN_RUNTIME_API));
  auto all = rec_.Take();
  EXPECT_EQ(Select(all, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020).size(), 2u);
  EXPECT_EQ(Select(all, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020).size(), 2u);
  EXPECT_EQ(Select(all, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaMemset_v3020).size(), 2u);
  EXPECT_EQ(Select(all, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchHostFunc_v10000).size(), 2u);
  EXPECT_EQ(Select(all, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaDeviceSynchronize_v3020).size(), 2u);
  EXPECT_EQ(Select(all, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020).size(), 2u);
}

TEST_F(Cupti, StreamOrderedAllocationAndPitchIds) {
  ASSERT_RT(cudaSetDevice(0));
  ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableDomain(1, sub_, CUPTI_CB_DOMAIN_RUNTIME_API));
  void* a = nullptr;
  ASSERT_RT(cudaMallocAsync(&a, 4096, nullptr));
  ASSERT_RT(cudaFreeAsync(a, nullptr));
  void* p = nullptr;
  size_t pitch = 0;
  ASSERT_RT(cudaMallocPitch(&p, &pitch, 100, 4));
  ASSERT_RT(cudaMemcpy2D(p, pitch, p, pitch, 100, 4, cudaMemcpyDeviceToDevice));
  ASSERT_RT(cudaDeviceSynchronize());
  ASSERT_RT(cudaFree(p));
  ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableDomain(0, sub_, CUPTI_CB_DOMAIN_RUNTIME_API));
  // The driver's own ids, from direct driver calls (which driver calls the runtime makes for
  // its own is its business).
  ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableDomain(1, sub_, CUPTI_CB_DOMAIN_DRIVER_API));
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAllocAsync(&d, 4096, nullptr));
  ASSERT_CU(cuMemFreeAsync(d, nullptr));
  ASSERT_CU(cuMemAllocPitch(&d, &pitch, 100, 4, 4));
  CUDA_MEMCPY2D copy{};
  copy.srcMemoryType = copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  copy.srcDevice = copy.dstDevice = d;
  copy.srcPitch = copy.dstPitch = pitch;
  copy.WidthInBytes = 100;
  copy.Height = 4;
  ASSERT_CU(cuMemcpy2D(&copy));
  ASSERT_CU(cuCtxSynchronize());
  ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableDomain(0, sub_, CUPTI_CB_DOMAIN_DRIVER_API));
  ASSERT_CU(cuMemFree(d));
  auto all = rec_.Take();
  auto runtime = [&](CUpti_CallbackId id) {
    return Select(all, CUPTI_CB_DOMAIN_RUNTIME_API, id).size();
  };
  auto driver = [&](CUpti_CallbackId id) { return Select(all, CUPTI_CB_DOMAIN_DRIVER_API, id).size(); };
  EXPECT_EQ(runtime(CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020), 2u);
  EXPECT_EQ(runtime(CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_v11020), 2u);
  EXPECT_EQ(runtime(CUPTI_RUNTIME_TRACE_CBID_cudaMallocPitch_v3020), 2u);
  EXPECT_EQ(runtime(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2D_v3020), 2u);
  EXPECT_EQ(driver(CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync), 2u);
  EXPECT_EQ(driver(CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync), 2u);
  EXPECT_EQ(driver(CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch_v2), 2u);
  EXPECT_EQ(driver(CUPTI_DRIVER_TRACE_CBID_cuMemcpy2D_v2), 2u);
}

TEST_F(Cupti, NoCallbacksAfterUnsubscribe) {
  ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableDomain(1, sub_, CUPTI_CB_DOMAIN_DRIVER_API));
  ASSERT_EQ(CUPTI_SUCCESS, cuptiUnsubscribe(sub_));
  subscribed_ = false;
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, 4096));
  ASSERT_CU(cuMemFree(d));
  EXPECT_TRUE(rec_.Take().empty());
}

TEST_F(Cupti, SecondSubscriberIsRefused) {
  CUpti_SubscriberHandle second = nullptr;
  EXPECT_EQ(CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED,
            cuptiSubscribe(&second, OnCallback, nullptr));
}

TEST(CuptiSubscribe, V2NamesTheSubscriberHoldingTheSlot) {
  ASSERT_CU(cuInit(0));
  Recorder rec;
  CUpti_SubscriberParams first{};
  first.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
  first.subscriberName = "conformance-first";
  CUpti_SubscriberHandle sub = nullptr;
  ASSERT_EQ(CUPTI_SUCCESS, cuptiSubscribe_v2(&sub, OnCallback, &rec, &first));
  char old_name[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN + 64] = {};
  CUpti_SubscriberParams second{};
  second.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
  second.subscriberName = "conformance-second";
  second.oldSubscriberName = old_name;
  second.oldSubscriberSize = sizeof old_name;
  CUpti_SubscriberHandle sub2 = nullptr;
  EXPECT_EQ(CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED,
            cuptiSubscribe_v2(&sub2, OnCallback, &rec, &second));
  EXPECT_NE(std::strstr(old_name, "conformance-first"), nullptr) << "old subscriber: " << old_name;
  ASSERT_EQ(CUPTI_SUCCESS, cuptiUnsubscribe(sub));
  // The slot is free again.
  ASSERT_EQ(CUPTI_SUCCESS, cuptiSubscribe(&sub, OnCallback, &rec));
  ASSERT_EQ(CUPTI_SUCCESS, cuptiUnsubscribe(sub));
}

TEST(CuptiSubscribe, ResultStrings) {
  const char* s = nullptr;
  ASSERT_EQ(CUPTI_SUCCESS, cuptiGetResultString(CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED, &s));
  ASSERT_NE(s, nullptr);
  EXPECT_GT(std::strlen(s), 0u);
  ASSERT_EQ(CUPTI_SUCCESS, cuptiGetResultString(CUPTI_SUCCESS, &s));
  ASSERT_NE(s, nullptr);
}

}  // namespace
}  // namespace conformance
