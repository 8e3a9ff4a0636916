// delta-trace synth: see synth_command.h. Checks its options (one line and exit 2 on a bad
// one), builds the workload, checks that the project's reader takes it, and writes it to FILE
// (gzip when FILE ends in .gz; written beside it as FILE.partial and renamed when whole) or to
// standard output; one line on standard error says what the seed chose and what came out.
#include "tools/synth_command.h"

#include <fmt/core.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "policy/dtr_log_reader.h"
#include "tools/cli_args.h"
#include "tools/export_file.h"
#include "tools/gpu_cost_model.h"
#include "tools/synth_workloads.h"

namespace delta::tools {

namespace {

constexpr std::string_view kCmd = "synth";
constexpr double kMaxScale = 1000;

int usage(const std::string& msg) {
  fmt::print(stderr, "delta-trace {}: {} (see 'delta-trace {} --help')\n", kCmd, msg, kCmd);
  return 2;
}

void printHelp() {
  fmt::print(
      "usage: delta-trace synth --family NAME --seed N [--scale X] [--gpu NAME] [-o FILE]\n"
      "Writes one synthetic training iteration (forward, backward, optimizer step) as a DTR op\n"
      "log, the JSON lines that replay, sweep and maxbatch read; the same family, seed, scale and\n"
      "GPU give the same bytes (docs/delta-trace.md).\n"
      "  --family NAME     the model family (below)\n"
      "  --seed N          picks the shapes: depth, widths, batch, sequence length (integer >= 0)\n"
      "  --scale X         multiplies the batch the seed picked (default 1; > 0, at most {})\n"
      "  --gpu NAME        times ops on this GPU's peak FLOPs and HBM bandwidth: {} (default {})\n"
      "  -o, --output FILE where to write (gzip if it ends in .gz; default or '-': standard output)\n"
      "families:\n",
      kMaxScale, gpuNames(), kDefaultGpu);
  for (const SynthFamily& f : synthFamilies()) fmt::print("  {:<15} {}\n", f.name, f.summary);
}

bool endsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Writes `text` to `path` (gzip for .gz) through PATH.partial (in place when `path` is not a
// regular file: tools/export_file.h); an error message or "".
std::string writeFile(const std::string& path, const std::string& text) {
  const std::string staging = stagingPathFor(path);
  const std::string& partial = staging.empty() ? path : staging;
  bool ok = true;
  if (endsWith(path, ".gz")) {
    gzFile gz = gzopen(partial.c_str(), "wb");
    if (gz == nullptr) return "cannot write " + path + ": " + std::strerror(errno);
    std::size_t done = 0;
    while (ok && done < text.size()) {
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(text.size() - done, 1u << 20));
      ok = gzwrite(gz, text.data() + done, chunk) == static_cast<int>(chunk);
      done += chunk;
    }
    ok = gzclose(gz) == Z_OK && ok;
  } else {
    std::FILE* f = std::fopen(partial.c_str(), "wb");
    if (f == nullptr) return "cannot write " + path + ": " + std::strerror(errno);
    ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    ok = std::fclose(f) == 0 && ok;
  }
  if (!ok || (!staging.empty() && std::rename(partial.c_str(), path.c_str()) != 0)) {
    const std::string why = std::strerror(errno);
    if (!staging.empty()) std::remove(partial.c_str());
    return "writing " + path + " failed: " + why;
  }
  return {};
}

}  // namespace

int synthCommand(const std::vector<std::string>& args) {
  std::vector<std::string> norm;
  for (const std::string& s : args) norm.push_back(s == "-o" ? "--output" : s);
  CliArgs a;
  if (std::string err = a.parse(norm, {{"family", true}, {"seed", true}, {"scale", true}, {"gpu", true},
                                       {"output", true}, {"help", false}});
      !err.empty()) {
    return usage(err);
  }
  if (a.has("help")) {
    printHelp();
    return 0;
  }
  if (!a.positional().empty()) return usage("unexpected argument '" + a.positional()[0] + "'");
  SynthOptions o;
  const auto family = a.value("family");
  if (!family) return usage("--family is required (known: " + synthFamilyNames() + ")");
  o.family = *family;
  bool known = false;
  for (const SynthFamily& f : synthFamilies()) known = known || f.name == o.family;
  if (!known) return usage("unknown family '" + o.family + "' (known: " + synthFamilyNames() + ")");
  const auto seed = a.value("seed");
  if (!seed) return usage("--seed is required");
  const std::optional<std::uint32_t> seed_value = parseCount(*seed);
  if (!seed_value) return usage("bad --seed '" + *seed + "': expected an integer >= 0");
  o.seed = *seed_value;
  if (auto v = a.value("scale")) {
    const std::optional<double> x = parsePositive(*v);
    if (!x || *x > kMaxScale) {
      return usage(fmt::format("bad --scale '{}': expected a number > 0 and at most {}", *v, kMaxScale));
    }
    o.scale = *x;
  }
  if (auto v = a.value("gpu")) {
    if (!findGpu(*v)) return usage("unknown --gpu '" + *v + "' (known: " + gpuNames() + ")");
    o.gpu = *v;
  }
  const std::string output = a.value("output").value_or("-");
  if (output.empty()) return usage("-o needs a file name ('-' for standard output)");

  const SynthResult r = synthesize(o);
  if (!r.error.empty()) return usage(r.error);
  // The reader must take what we write: a failure here is a bug of the generator.
  const policy::ImportResult check = policy::parseDtrLog(r.log, o.family);
  if (!check.error.empty()) {
    fmt::print(stderr, "delta-trace {}: internal error, the log does not read back: {}\n", kCmd, check.error);
    return 1;
  }
  if (output == "-") {
    if (std::fwrite(r.log.data(), 1, r.log.size(), stdout) != r.log.size() || std::fflush(stdout) != 0) {
      fmt::print(stderr, "delta-trace {}: writing standard output failed\n", kCmd);
      return 1;
    }
  } else if (std::string err = writeFile(output, r.log); !err.empty()) {
    fmt::print(stderr, "delta-trace {}: {}\n", kCmd, err);
    return 1;
  }
  std::string chose;
  for (const auto& [name, value] : r.choices) chose += fmt::format("{}{} {}", chose.empty() ? "" : ", ", name, value);
  const policy::Workload& w = check.workload;
  const auto [largest, largest_op] = largestWorkingSet(w);
  fmt::print(stderr,
             "delta-trace {}: {} seed {} scale {}: {}; {} ops, peak {:.3f} GiB, compute {:.2f} ms, largest op {} "
             "({:.1f} % of the peak)\n",
             kCmd, o.family, o.seed, o.scale, chose, w.ops.size(), static_cast<double>(w.peakBytes()) / (1u << 30),
             static_cast<double>(w.computeNs()) / 1e6, w.ops[largest_op].name,
             100.0 * static_cast<double>(largest) / static_cast<double>(w.peakBytes()));
  return 0;
}

}  // namespace delta::tools
