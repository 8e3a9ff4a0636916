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

}  // namespace delta::shim
