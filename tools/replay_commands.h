// delta-trace's replay subcommands: `replay` (one policy, one budget), `sweep` (policies x
// budgets x files, as a table or CSV) and `maxbatch` (largest batch factor that fits a budget
// within an overhead). Each returns the process exit status: 0 ok, 1 bad input file, 2 bad usage.
#pragma once

#include <string>
#include <vector>

namespace delta::tools {

int replayCommand(const std::vector<std::string>& args);
int sweepCommand(const std::vector<std::string>& args);
int maxbatchCommand(const std::vector<std::string>& args);

}  // namespace delta::tools
