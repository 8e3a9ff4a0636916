// Trace format dispatch: see trace_loader.h.
#include "tools/trace_loader.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include "policy/line_reader.h"
#include "tools/json_document.h"
#include "tools/pytorch_et.h"
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

enum class JsonKind { kNone, kExecutionTrace, kKineto };

// An Execution Trace is one JSON object with "schema" and "nodes"; a Kineto trace has
// "traceEvents". Both keys come early in the files PyTorch writes; a DTR log's lines are
// objects with "INSTRUCTION".
JsonKind sniffJson(const std::string& path) {
  std::string head;
  if (!readTextPrefix(path, 1 << 16, head).empty()) return JsonKind::kNone;
  const std::size_t first = head.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || head[first] != '{') return JsonKind::kNone;
  if (head.find("\"INSTRUCTION\"") != std::string::npos) return JsonKind::kNone;
  if (head.find("\"nodes\"") != std::string::npos && head.find("\"schema\"") != std::string::npos) {
    return JsonKind::kExecutionTrace;
  }
  if (head.find("\"traceEvents\"") != std::string::npos) return JsonKind::kKineto;
  return JsonKind::kNone;
}

}  // namespace

policy::ImportResult loadWorkload(const std::string& path) { return loadWorkload(path, LoadOptions{}); }

policy::ImportResult loadWorkload(const std::string& path, const LoadOptions& options,
                                  std::vector<std::string>* notes) {
  policy::ImportResult r;
  const bool pytorch_options = !options.kineto_path.empty() || !options.gpu.empty();
  const char* kOnlyEt = ": --kineto and --gpu apply to PyTorch Execution Traces only; drop them for this file";
  if (startsWithTraceMagic(path)) {
    if (pytorch_options) {
      r.error = path + kOnlyEt;
      return r;
    }
    return importShimTrace(path);
  }
  switch (sniffJson(path)) {
    case JsonKind::kExecutionTrace: {
      EtImport et = importPyTorchEt(path, {options.kineto_path, options.gpu});
      r.error = std::move(et.error);
      r.workload = std::move(et.workload);
      if (notes != nullptr) *notes = std::move(et.notes);
      return r;
    }
    case JsonKind::kKineto:
      r.error = path + ": a Kineto trace holds no tensors; replay its Execution Trace and pass this file "
                       "with --kineto";
      return r;
    case JsonKind::kNone:
      break;
  }
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
  if (first != std::string::npos && line[first] == '{') {
    if (pytorch_options) {
      r.error = path + kOnlyEt;
      return r;
    }
    return policy::readDtrLog(path);
  }
  r.error = path + ": unrecognised trace format (expected a DELTA trace written by libdelta.so, "
                   "a DTR op log: JSON lines, or a PyTorch Execution Trace: JSON; gzip or plain)";
  return r;
}

}  // namespace delta::tools
