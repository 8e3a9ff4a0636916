// Opens any trace delta-trace can replay and turns it into a policy::Workload. Today: DTR op logs
// (JSON lines, gzip or plain). The shim's own trace files will be added here.
#pragma once

#include <string>

#include "policy/dtr_log_reader.h"

namespace delta::tools {

policy::ImportResult loadWorkload(const std::string& path);

}  // namespace delta::tools
