#include "shim/log.h"

#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <ctime>

namespace delta::shim {
namespace {

std::atomic<int> gVerbosity{0};

// At most kBurst lines, then one more per second: enough to explain, never a flood.
constexpr int kBurst = 50;
std::atomic<int> gPrinted{0};
std::atomic<long> gLastSecond{0};

bool allowed() {
  if (gPrinted.fetch_add(1, std::memory_order_relaxed) < kBurst) return true;
  timespec now;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
  long last = gLastSecond.load(std::memory_order_relaxed);
  return now.tv_sec != last && gLastSecond.compare_exchange_strong(last, now.tv_sec);
}

void emit(const char* format, va_list args) {
  char line[2048];  // the stats line is about 1 KiB
  int prefix = std::snprintf(line, sizeof line, "libdelta: ");
  int body = std::vsnprintf(line + prefix, sizeof line - prefix - 1, format, args);
  size_t length = prefix + (body < 0 ? 0 : static_cast<size_t>(body));
  if (length > sizeof line - 2) length = sizeof line - 2;
  line[length++] = '\n';
  ssize_t ignored = write(STDERR_FILENO, line, length);
  (void)ignored;
}

}  // namespace

void logLine(const char* format, ...) {
  if (!allowed()) return;
  va_list args;
  va_start(args, format);
  emit(format, args);
  va_end(args);
}

void logVerbose(int level, const char* format, ...) {
  if (gVerbosity.load(std::memory_order_relaxed) < level) return;
  va_list args;
  va_start(args, format);
  emit(format, args);
  va_end(args);
}

void setVerbosity(int level) { gVerbosity.store(level, std::memory_order_relaxed); }

int verbosity() { return gVerbosity.load(std::memory_order_relaxed); }

}  // namespace delta::shim
