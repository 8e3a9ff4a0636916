// Opens any trace delta-trace can replay and turns it into a policy::Workload, recognising it by
// content: the shim's own trace files (DELTA_TRACE; see shim_trace_import.h), DTR op logs (JSON
// lines, gzip or plain) and PyTorch Execution Traces (JSON, gzip or plain; pytorch_et.h), the
// latter timed by a paired Kineto trace or a GPU's cost model.
#pragma once

#include <string>
#include <vector>

#include "policy/dtr_log_reader.h"

namespace delta::tools {

struct LoadOptions {
  std::string kineto_path;  // --kineto FILE: durations of a PyTorch Execution Trace
  std::string gpu;          // --gpu NAME: the cost model's GPU when there is no Kineto trace
};

policy::ImportResult loadWorkload(const std::string& path);
// The same with the options of PyTorch traces; `notes` (if given) receives what the importer
// inferred (iterations, batch, join coverage), one line each. Options that do not apply to the
// file's format are an error.
policy::ImportResult loadWorkload(const std::string& path, const LoadOptions& options,
                                  std::vector<std::string>* notes = nullptr);

}  // namespace delta::tools
