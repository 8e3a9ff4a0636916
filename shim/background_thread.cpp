#include "shim/background_thread.h"

#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace delta::shim {

namespace {
constexpr int kBackgroundNice = 10;
}  // namespace

bool startBackgroundThread(pthread_t* thread, void* (*main)(void*), void* argument) {
  // The thread inherits this thread's signal mask: block everything around its creation.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  const int rc = pthread_create(thread, nullptr, main, argument);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return rc == 0;
}

void becomeBackgroundThread(const char* name) {
  pthread_setname_np(pthread_self(), name);
  // Linux applies nice per thread (PRIO_PROCESS with a thread id); a new thread starts at its
  // creator's level.
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, tid);
  if (errno == 0) (void)setpriority(PRIO_PROCESS, tid, nice + kBackgroundNice);
}

}  // namespace delta::shim
