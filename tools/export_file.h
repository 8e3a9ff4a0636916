// The output of `delta-trace export` (every format): written beside OUT, as OUT.partial, and
// renamed over it only once the whole input was read, so that a trace found corrupt half-way
// leaves no half export where the user asked for one (and does not destroy a good one); "-" is
// standard output. A trace cut short (a crashed job) is exported up to its last whole record,
// with a warning.
#pragma once

#include <cstdio>
#include <string>

#include "trace/trace_reader.h"

namespace delta::tools {

// Where to write `output` before renaming it into place: OUT.partial, or "" to write to OUT
// itself when it exists and is not a regular file (/dev/null, a FIFO, a terminal): renaming a
// file over those would replace them (and, as root, /dev/null with it).
std::string stagingPathFor(const std::string& output);

class ExportFile {
 public:
  ExportFile(const std::string& output, bool binary);
  ExportFile(const ExportFile&) = delete;
  ExportFile& operator=(const ExportFile&) = delete;
  // nullptr when it could not be created (said on stderr).
  std::FILE* file() const { return out_; }
  // Closes it, keeps or removes it as `reader` ended, says what went wrong; the exit status.
  int finish(const trace::TraceReader& reader);

 private:
  std::string output_;
  std::string partial_;
  bool toFile_;
  std::FILE* out_;
};

}  // namespace delta::tools
