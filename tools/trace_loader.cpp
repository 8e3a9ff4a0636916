// Trace format dispatch: see trace_loader.h.
#include "tools/trace_loader.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include "policy/line_reader.h"
#include "tools/shim_trace_import.h"
#include "trace/format.h"

namespace delta::tools {

namespace {

bool startsWithTraceMagic(const std::string& path) {
  char magic[sizeof trace::kMagic] = {};
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool match = read(fd, magic, sizeof magic) == static_cast<ssize_t>(sizeof magic) &&
               std::memcmp(magic, trace::kMagic, sizeof magic) == 0;
  close(fd);
  return match;
}

}  // namespace

policy::ImportResult loadWorkload(const std::string& path) {
  if (startsWithTraceMagic(path)) return importShimTrace(path);
  policy::ImportResult r;
  policy::LineReader reader;
  if (std::string err = reader.open(path); !err.empty()) {
    r.error = err;
    return r;
  }
  std::string line;
  while (reader.next(line) && line.find_first_not_of(" \t\r") == std::string::npos) {
  }
  if (!reader.error().empty()) {
    r.error = reader.error();
    return r;
  }
  const std::size_t first = line.find_first_not_of(" \t\r");
  if (first != std::string::npos && line[first] == '{') return policy::readDtrLog(path);
  r.error = path + ": unrecognised trace format (expected a DELTA trace written by libdelta.so, "
                   "or a DTR op log: JSON lines, gzip or plain)";
  return r;
}

}  // namespace delta::tools
