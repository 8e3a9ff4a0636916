// Trace format dispatch: see trace_loader.h.
#include "tools/trace_loader.h"

#include "policy/line_reader.h"

namespace delta::tools {

policy::ImportResult loadWorkload(const std::string& path) {
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
  r.error = path + ": unrecognised trace format (expected a DTR op log: JSON lines, gzip or plain)";
  return r;
}

}  // namespace delta::tools
