// delta-trace: offline tools over DELTA's traces. One table of subcommands; each parses its own
// options and answers --help. To add one (summary, export, plot, diff, synth), add a row to kCommands.
#include <fmt/core.h>

#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "tools/replay_commands.h"
#include "tools/synth_command.h"
#include "tools/trace_commands.h"

namespace {

struct Subcommand {
  std::string_view name;
  std::string_view summary;
  int (*run)(const std::vector<std::string>& args);
};

constexpr Subcommand kCommands[] = {
    {"replay", "replay a trace through one policy and budget", delta::tools::replayCommand},
    {"sweep", "replay traces under several policies and budgets (table or CSV)", delta::tools::sweepCommand},
    {"maxbatch", "largest batch factor within a budget and an overhead", delta::tools::maxbatchCommand},
    {"summary", "peaks, traffic, stalls and over-budget launches of a trace", delta::tools::summaryCommand},
    {"export", "a trace as Chrome trace JSON or a PyTorch memory snapshot (FILE -o OUT)", delta::tools::exportCommand},
    {"plot", "a trace's memory timeline as an SVG (FILE -o memory.svg)", delta::tools::plotCommand},
    {"diff", "two traces of the same job side by side", delta::tools::diffCommand},
    {"synth", "write a synthetic training iteration (a workload family) as a DTR op log", delta::tools::synthCommand},
};

void printUsage(std::FILE* out) {
  fmt::print(out, "usage: delta-trace COMMAND [OPTIONS] FILE...\ncommands:\n");
  for (const Subcommand& c : kCommands) fmt::print(out, "  {:<10} {}\n", c.name, c.summary);
  fmt::print(out, "'delta-trace COMMAND --help' describes a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    printUsage(stderr);
    return 2;
  }
  const std::string_view name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    printUsage(stdout);
    return 0;
  }
  for (const Subcommand& c : kCommands) {
    if (c.name == name) return c.run(std::vector<std::string>(argv + 2, argv + argc));
  }
  fmt::print(stderr, "delta-trace: unknown command '{}' (commands:", name);
  for (const Subcommand& c : kCommands) fmt::print(stderr, " {}", c.name);
  fmt::print(stderr, ")\n");
  return 2;
}
