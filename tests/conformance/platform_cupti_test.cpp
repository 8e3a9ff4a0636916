/* CUPTI on cudasim-only behaviour: launches carry the kernel's name in symbolName (runtime
 * and driver launches), and by default a runtime call raises its runtime callback around
 * the driver callbacks of the driver calls it makes. */
#include <cudasim/cudasim.h>
#include <cupti.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "conformance_util.h"

namespace conformance {
namespace {

void named_stub(int*) {}
void NamedBody(void** params, dim3, dim3) { **static_cast<int**>(params[0]) = 5; }
const size_t kSizes[] = {sizeof(void*)};
const bool kRegistered = [] {
  cudasimRegisterKernel(reinterpret_cast<const void*>(&named_stub), "named_kernel_for_cupti",
                        NamedBody, 1, kSizes);
  return true;
}();

struct Event {
  CUpti_CallbackDomain domain;
  CUpti_CallbackId cbid;
  CUpti_ApiCallbackSite site;
  std::string symbol;
  uint32_t correlation;
  const void* launch_func = nullptr;  // cudaLaunchKernel_v7000_params::func
  CUfunction cu_func = nullptr;       // cuLaunchKernel_params::f
};

struct Log {
  std::mutex mutex;
  std::vector<Event> events;
};

void CUPTIAPI OnCallback(void* userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                         const void* data) {
  if (domain != CUPTI_CB_DOMAIN_DRIVER_API && domain != CUPTI_CB_DOMAIN_RUNTIME_API) return;
  auto* log = static_cast<Log*>(userdata);
  auto* cb = static_cast<const CUpti_CallbackData*>(data);
  Event e{domain, cbid, cb->callbackSite, cb->symbolName ? cb->symbolName : "", cb->correlationId};
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API && cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000)
    e.launch_func = static_cast<const cudaLaunchKernel_v7000_params*>(cb->functionParams)->func;
  if (domain == CUPTI_CB_DOMAIN_DRIVER_API && cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel)
    e.cu_func = static_cast<const cuLaunchKernel_params*>(cb->functionParams)->f;
  std::lock_guard<std::mutex> lock(log->mutex);
  log->events.push_back(e);
}

class PlatformCupti : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(kRegistered);
    ASSERT_RT(cudaSetDevice(0));
    ASSERT_RT(cudaMalloc(reinterpret_cast<void**>(&out_), 64));
    ASSERT_EQ(CUPTI_SUCCESS, cuptiSubscribe(&sub_, OnCallback, &log_));
    ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableDomain(1, sub_, CUPTI_CB_DOMAIN_RUNTIME_API));
    ASSERT_EQ(CUPTI_SUCCESS, cuptiEnableDomain(1, sub_, CUPTI_CB_DOMAIN_DRIVER_API));
  }
  void TearDown() override {
    if (sub_ != nullptr) {
      EXPECT_EQ(CUPTI_SUCCESS, cuptiUnsubscribe(sub_));
    }
    EXPECT_RT(cudaDeviceSynchronize());
    EXPECT_RT(cudaFree(out_));
  }
  std::vector<Event> Take() {
    cuptiEnableDomain(0, sub_, CUPTI_CB_DOMAIN_RUNTIME_API);
    cuptiEnableDomain(0, sub_, CUPTI_CB_DOMAIN_DRIVER_API);
    std::lock_guard<std::mutex> lock(log_.mutex);
    return std::move(log_.events);
  }
  static std::vector<Event> Select(const std::vector<Event>& all, CUpti_CallbackDomain d,
                                   CUpti_CallbackId id) {
    std::vector<Event> out;
    for (const auto& e : all)
      if (e.domain == d && e.cbid == id) out.push_back(e);
    return out;
  }
  CUpti_SubscriberHandle sub_ = nullptr;
  Log log_;
  int* out_ = nullptr;
};

TEST_F(PlatformCupti, RuntimeLaunchCarriesKernelNameInBothDomains) {
  void* args[] = {&out_};
  ASSERT_RT(cudaLaunchKernel(reinterpret_cast<const void*>(&named_stub), dim3(1), dim3(1), args, 0,
                             nullptr));
  auto all = Take();
  auto rt = Select(all, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000);
  ASSERT_EQ(rt.size(), 2u);
  EXPECT_EQ(rt[0].symbol, "named_kernel_for_cupti");
  EXPECT_EQ(rt[1].symbol, "named_kernel_for_cupti");
  EXPECT_EQ(rt[0].launch_func, reinterpret_cast<const void*>(&named_stub));
  EXPECT_EQ(rt[0].correlation, rt[1].correlation);
  auto drv = Select(all, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel);
  ASSERT_EQ(drv.size(), 2u) << "the runtime's internal cuLaunchKernel raises driver callbacks";
  EXPECT_EQ(drv[0].symbol, "named_kernel_for_cupti");
}

TEST_F(PlatformCupti, RuntimeCallbackEnclosesItsDriverCallbacks) {
  void* p = nullptr;
  ASSERT_RT(cudaMalloc(&p, 4096));
  auto all = Take();
  ASSERT_RT(cudaFree(p));
  int rt_enter = -1, drv_enter = -1, drv_exit = -1, rt_exit = -1;
  for (int i = 0; i < static_cast<int>(all.size()); ++i) {
    const Event& e = all[i];
    if (e.domain == CUPTI_CB_DOMAIN_RUNTIME_API && e.cbid == CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020)
      (e.site == CUPTI_API_ENTER ? rt_enter : rt_exit) = i;
    if (e.domain == CUPTI_CB_DOMAIN_DRIVER_API && e.cbid == CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2)
      (e.site == CUPTI_API_ENTER ? drv_enter : drv_exit) = i;
  }
  ASSERT_GE(rt_enter, 0);
  ASSERT_GE(drv_enter, 0) << "cudaMalloc raised no cuMemAlloc_v2 driver callback";
  EXPECT_LT(rt_enter, drv_enter);
  EXPECT_LT(drv_enter, drv_exit);
  EXPECT_LT(drv_exit, rt_exit);
}

TEST_F(PlatformCupti, DriverLaunchCarriesKernelName) {
  cudaFunction_t f = nullptr;
  ASSERT_RT(cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(&named_stub)));
  void* args[] = {&out_};
  ASSERT_CU(cuLaunchKernel(reinterpret_cast<CUfunction>(f), 1, 1, 1, 1, 1, 1, 0, nullptr, args,
                           nullptr));
  CUlaunchConfig cfg{};
  cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
  ASSERT_CU(cuLaunchKernelEx(&cfg, reinterpret_cast<CUfunction>(f), args, nullptr));
  auto all = Take();
  auto drv = Select(all, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel);
  ASSERT_EQ(drv.size(), 2u);
  EXPECT_EQ(drv[0].symbol, "named_kernel_for_cupti");
  EXPECT_EQ(drv[1].symbol, "named_kernel_for_cupti");
  EXPECT_EQ(drv[0].cu_func, reinterpret_cast<CUfunction>(f));
  auto ex = Select(all, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx);
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(ex[0].symbol, "named_kernel_for_cupti");
}

}  // namespace
}  // namespace conformance
