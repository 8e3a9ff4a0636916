// The policy's planner, off the launch path (issue 16): one background thread runs the plan a
// newly learned iteration asks for (policy.h: PolicyConfig::plan_elsewhere, PlanRequest) while
// the job goes on; the residency manager hands the result to the policy, which adopts it at
// the next iteration boundary.
//
// The launch path only ever looks at one atomic flag (ready()); submitting and taking a plan
// take this object's own mutex, once per learned iteration, never while the thread plans.
// The thread is started at the first request, with every signal blocked (signals meant for the
// job never land on it) and a lower scheduling priority (planning for seconds must not take
// the CPU from the threads that feed the GPU). It calls no CUDA function and takes no lock of
// the shim's. After fork() the child has no planner thread; the shim is passed through there.
#pragma once

#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "policy/planner.h"

namespace delta::shim {

class PlannerThread {
 public:
  PlannerThread() = default;
  PlannerThread(const PlannerThread&) = delete;
  PlannerThread& operator=(const PlannerThread&) = delete;
  // The thread, if started, is left to the process's end (the shim is never torn down).
  ~PlannerThread() = default;

  // Plans `request` on the thread; it must stay untouched until its plan is taken. False when
  // the thread cannot be started (the caller delivers an empty plan instead) or one is still
  // being planned (the policy never asks twice: a caller bug).
  bool submit(const policy::PlanRequest* request);
  // A plan is waiting to be taken: one acquire load.
  bool ready() const { return ready_.load(std::memory_order_acquire); }
  // The plan and the planner thread's wall-clock time on it; once per submit, after ready().
  policy::Plan take(int64_t* planningNs);
  bool started() const { return started_; }

 private:
  static void* threadMain(void* self);
  void run();

  std::mutex mutex_;
  std::condition_variable wake_;
  const policy::PlanRequest* job_ = nullptr;  // submitted, not yet picked up
  bool busy_ = false;                         // submitted, not yet taken
  policy::Plan result_;
  int64_t planningNs_ = 0;
  std::atomic<bool> ready_{false};
  pthread_t thread_{};
  bool started_ = false;
};

}  // namespace delta::shim
