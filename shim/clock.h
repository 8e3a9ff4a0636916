// Monotonic nanoseconds: what the shim times its own work by (host waits, pinning, planning).
#pragma once

#include <time.h>

#include <cstdint>

namespace delta::shim {

inline int64_t nowNs() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return int64_t(now.tv_sec) * 1000000000 + now.tv_nsec;
}

}  // namespace delta::shim
