// Opens any trace delta-trace can replay and turns it into a policy::Workload: the shim's own
// trace files (DELTA_TRACE; see shim_trace_import.h) and DTR op logs (JSON lines, gzip or plain).
#pragma once

#include <string>

#include "policy/dtr_log_reader.h"

namespace delta::tools {

policy::ImportResult loadWorkload(const std::string& path);

}  // namespace delta::tools
