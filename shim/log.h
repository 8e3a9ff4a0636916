// Messages from the shim to the user: one line each, prefixed "libdelta: ", written with
// write(2) from a stack buffer (no allocation, usable anywhere but a signal handler),
// rate-limited so that a misbehaving job cannot flood its own log.
#pragma once

#include <atomic>

namespace delta::shim {

// Always printed (subject to the rate limit): warnings and errors the user must see.
void logLine(const char* format, ...) __attribute__((format(printf, 1, 2)));

// Printed when DELTA_VERBOSE >= level.
void logVerbose(int level, const char* format, ...) __attribute__((format(printf, 2, 3)));
void setVerbosity(int level);
// DELTA_VERBOSE's level: to skip building what only a verbose line prints.
int verbosity();

// Prints a warning the first time only; `once` is the caller's static flag.
#define DELTA_WARN_ONCE(...)                                          \
  do {                                                                \
    static std::atomic<bool> warned_{false};                          \
    if (!warned_.exchange(true)) ::delta::shim::logLine(__VA_ARGS__); \
  } while (0)

}  // namespace delta::shim
