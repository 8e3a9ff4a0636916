// delta-trace synth: writes a synthetic training iteration (synth_workloads.h) as a DTR op log.
#pragma once

#include <string>
#include <vector>

namespace delta::tools {

int synthCommand(const std::vector<std::string>& args);

}  // namespace delta::tools
