// delta-trace's subcommands over the shim's own traces: `summary`, `export` (--chrome,
// --pytorch-snapshot), `plot` and `diff`. Each streams its input (bounded memory) and returns the exit status: 0 ok, 1 bad
// or unreadable input (the message names the byte offset), 2 bad usage.
#pragma once

#include <string>
#include <vector>

namespace delta::tools {

int summaryCommand(const std::vector<std::string>& args);
int exportCommand(const std::vector<std::string>& args);
int plotCommand(const std::vector<std::string>& args);
int diffCommand(const std::vector<std::string>& args);

}  // namespace delta::tools
