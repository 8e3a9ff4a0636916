#include "shim/planner_thread.h"

#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <utility>

namespace delta::shim {

namespace {
int64_t monotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
// Below the job's threads: 10 nice levels less gives it about a tenth of a CPU the job wants.
constexpr int kPlannerNice = 10;
}  // namespace

bool PlannerThread::submit(const policy::PlanRequest* request) {
  std::lock_guard lock(mutex_);
  if (busy_) return false;
  if (!started_) {
    // The thread inherits this thread's signal mask: block everything around its creation.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    const int rc = pthread_create(&thread_, nullptr, &PlannerThread::threadMain, this);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (rc != 0) return false;
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
  pthread_setname_np(pthread_self(), "delta-planner");
  // Linux applies nice per thread (PRIO_PROCESS with a thread id); a new thread starts at its
  // creator's level.
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, tid);
  if (errno == 0) (void)setpriority(PRIO_PROCESS, tid, nice + kPlannerNice);
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
    const int64_t start = monotonicNs();
    policy::Plan plan = request->run();
    const int64_t took = monotonicNs() - start;
    std::lock_guard lock(mutex_);
    result_ = std::move(plan);
    planningNs_ = took;
    ready_.store(true, std::memory_order_release);
  }
}

}  // namespace delta::shim
