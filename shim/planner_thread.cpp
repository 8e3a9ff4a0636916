#include "shim/planner_thread.h"

#include <utility>

#include "shim/background_thread.h"
#include "shim/clock.h"

namespace delta::shim {

bool PlannerThread::submit(const policy::PlanRequest* request) {
  std::lock_guard lock(mutex_);
  if (busy_) return false;
  if (!started_) {
    if (!startBackgroundThread(&thread_, &PlannerThread::threadMain, this)) return false;
    pthread_detach(thread_);
    started_ = true;
  }
  job_ = request;
  busy_ = true;
  wake_.notify_one();
  return true;
}

policy::Plan PlannerThread::take(int64_t* planningNs) {
  std::lock_guard lock(mutex_);
  ready_.store(false, std::memory_order_relaxed);
  busy_ = false;
  if (planningNs != nullptr) *planningNs = planningNs_;
  return std::move(result_);
}

void* PlannerThread::threadMain(void* self) {
  becomeBackgroundThread("delta-planner");
  static_cast<PlannerThread*>(self)->run();
  return nullptr;
}

void PlannerThread::run() {
  for (;;) {
    const policy::PlanRequest* request = nullptr;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] { return job_ != nullptr; });
      request = job_;
      job_ = nullptr;
    }
    const int64_t start = nowNs();
    policy::Plan plan = request->run();
    const int64_t took = nowNs() - start;
    std::lock_guard lock(mutex_);
    result_ = std::move(plan);
    planningNs_ = took;
    ready_.store(true, std::memory_order_release);
  }
}

}  // namespace delta::shim
