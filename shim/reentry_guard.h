// The shim's own CUDA calls raise CUPTI callbacks and may come back through its interposed
// functions. A thread-local depth marks "inside the shim": interposers then pass straight
// through and the CUPTI callback ignores the call (libfaketime's "don't intercept" scope).
#pragma once

namespace delta::shim {

// constinit: no TLS initialisation function, so this works even before the library's
// constructors run (an ASan-built program calls dlsym, hence us, that early).
inline constinit thread_local int tShimDepth = 0;

class ReentryGuard {
 public:
  ReentryGuard() { ++tShimDepth; }
  ~ReentryGuard() { --tShimDepth; }
  ReentryGuard(const ReentryGuard&) = delete;
  ReentryGuard& operator=(const ReentryGuard&) = delete;
};

inline bool insideShim() { return tShimDepth > 0; }

// The program's own calls made while the shim handles one of its calls: a recompute callback,
// run while the launch that needs its buffer is prepared. Real CUPTI gives a call made inside
// another call's callback that call's correlation id (seen on an H200), the id that otherwise
// marks the driver calls a runtime call makes for itself, which the switchboard skips as
// handled. Within this scope they are the program's, and handled.
inline constinit thread_local int tProgramCallDepth = 0;

class ProgramCallsScope {
 public:
  ProgramCallsScope() { ++tProgramCallDepth; }
  ~ProgramCallsScope() { --tProgramCallDepth; }
  ProgramCallsScope(const ProgramCallsScope&) = delete;
  ProgramCallsScope& operator=(const ProgramCallsScope&) = delete;
};

}  // namespace delta::shim
