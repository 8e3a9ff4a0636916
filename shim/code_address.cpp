#include "shim/code_address.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace delta::shim {

namespace {

// One maps line, "start-end perms ...": whether it covers `address`, and if so whether the
// mapping is executable.
enum class Covers { kNo, kData, kCode };

Covers parseLine(const char* line, const char* end, uintptr_t address) {
  char* next = nullptr;
  const uintptr_t start = std::strtoull(line, &next, 16);
  if (next == nullptr || next >= end || *next != '-') return Covers::kNo;
  const uintptr_t stop = std::strtoull(next + 1, &next, 16);
  if (next == nullptr || next + 4 >= end || *next != ' ') return Covers::kNo;
  if (address < start || address >= stop) return Covers::kNo;
  return next[3] == 'x' ? Covers::kCode : Covers::kData;
}

}  // namespace

bool isCodeOrUnknownAddress(const void* address) {
  const uintptr_t wanted = reinterpret_cast<uintptr_t>(address);
  const int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  // Lines are short (a path of at most PATH_MAX); one longer than the buffer is skipped.
  char buffer[8192];
  size_t have = 0;
  bool skipping = false;
  Covers found = Covers::kNo;
  while (found == Covers::kNo) {
    const ssize_t got = read(fd, buffer + have, sizeof buffer - have);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    have += static_cast<size_t>(got);
    size_t lineStart = 0;
    for (size_t i = 0; i < have && found == Covers::kNo; ++i) {
      if (buffer[i] != '\n') continue;
      buffer[i] = '\0';
      if (!skipping) found = parseLine(buffer + lineStart, buffer + i, wanted);
      skipping = false;
      lineStart = i + 1;
    }
    if (lineStart == 0 && have == sizeof buffer) {
      skipping = true;  // the rest of an over-long line follows
      have = 0;
      continue;
    }
    std::memmove(buffer, buffer + lineStart, have - lineStart);
    have -= lineStart;
  }
  close(fd);
  return found != Covers::kData;
}

}  // namespace delta::shim
