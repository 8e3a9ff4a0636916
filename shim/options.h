// DELTA's options: the one table of DELTA_* environment variables (name, default, meaning,
// parser), read once at start, and the second check once device and host memory are known.
//
// Contract: nothing here throws (the callers sit behind extern "C" entry points), nothing
// reads the environment behind the caller's back (the caller passes `environ`), and the
// table is constexpr, so parseOptions works from the shim's constructor before any static
// initialiser of ours has run. Not on the hot path: parse once, keep the Options.
// Depends on glibc, the C++ standard library and policy/policy_factory.h (policy names) only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace delta::shim {

// A size written either as bytes or as a percentage of some total (device or host memory),
// resolved later by resolveOptions.
struct SizeSpec {
  uint64_t bytes = 0;      // when !isPercent
  double percent = 0;      // when isPercent: 0 < percent <= 100
  bool isPercent = false;
};

// The options in force. Members start zeroed here; the defaults live in the table only, and
// parseOptions applies them (parseOptions on an empty environment gives the defaults).
struct Options {
  enum class Mode { kVmm, kUvm };

  SizeSpec budget;             // DELTA_BUDGET
  std::string policy;          // DELTA_POLICY: a name makePolicy accepts without a future
  std::string tracePath;       // DELTA_TRACE: kept as written ('%p', '%r' expanded by the writer)
  bool traceStacks = false;    // DELTA_TRACE_STACKS
  bool traceOverwrite = false; // DELTA_TRACE_OVERWRITE
  SizeSpec hostLimit;          // DELTA_HOST_LIMIT
  uint64_t minBytes = 0;       // DELTA_MIN_BYTES
  int verbose = 0;             // DELTA_VERBOSE: 0, 1 or 2
  bool disabled = false;       // DELTA_DISABLE
  bool strict = false;         // DELTA_STRICT
  std::string cuptiPath;       // DELTA_CUPTI_PATH: empty = search
  Mode mode = Mode::kVmm;      // DELTA_MODE
  bool prefetch = false;       // DELTA_PREFETCH
  bool plan = false;           // DELTA_PLAN
};

// One row of the table as callers may see it (the parser and formatter stay inside).
// In `meaning` and `accepted`, "{policies}" stands for onlinePolicyNames(): the list lives in
// the policy factory only, and messages and the Markdown table expand it.
struct OptionInfo {
  std::string_view name;          // "DELTA_BUDGET"
  std::string_view defaultValue;  // as a user would write it: "90%"
  std::string_view meaning;       // one line, Markdown
  std::string_view accepted;      // what an error message says is accepted
};

std::size_t optionCount();
const OptionInfo& optionInfo(std::size_t index);  // index < optionCount(), table order

// The policies the shim can run, from policy::policyNames() less those that need the future
// (replay only): "delta, lru, dtr, swap-only, recompute-only".
std::string onlinePolicyNames();

// Parses every DELTA_* entry of `environment` (a NULL-terminated array like `environ`; NULL is
// an empty environment). Unset variables take the table's default. On error returns false,
// leaves `options` unchanged and sets `error` to ONE line (no newline) naming the variable, the
// value and what is accepted, e.g.
//   libdelta: DELTA_BUDGET='12 parsecs' is not valid: expected a size such as 6GiB or a
//   percentage of device memory such as 50%
// An unknown DELTA_* variable is an error too (with "did you mean ...?" when a known name is
// within edit distance 2). A variable set twice: the first counts, as with getenv. When several
// things are wrong, the line reports the first unknown variable, else the first bad value in
// table order. DELTA_DISABLE=1 (valid) short-circuits: the result is the defaults with
// `disabled` set and nothing else is checked, so the off switch works even when a wrapper sets a
// variable this version rejects.
bool parseOptions(char* const* environment, Options& options, std::string& error);

// Second stage, once the device's and host's memory are known (hostBytes 0: unknown, then a
// percentage host limit is an error and a size is taken as is). Sets the absolute budget and
// host limit; false and one line in `error` when out of range, e.g.
//   libdelta: DELTA_BUDGET='200GiB' is more than the device's 80.0 GiB of memory
bool resolveOptions(const Options& options, uint64_t deviceBytes, uint64_t hostBytes,
                    uint64_t& budgetBytes, uint64_t& hostLimitBytes, std::string& error);

// The options in force, one line each, table order, each ending in '\n':
//   libdelta: DELTA_BUDGET=6GiB (default: 90%)
//   libdelta: DELTA_POLICY=delta (default)
std::string describeOptions(const Options& options);

// The table as Markdown: "| variable | default | meaning |", a separator, one row per option,
// each line ending in '\n'. docs/options.md and README.md hold it between the markers below.
std::string optionsMarkdownTable();
inline constexpr std::string_view kTableBeginMarker = "<!-- options-table-begin -->";
inline constexpr std::string_view kTableEndMarker = "<!-- options-table-end -->";

// --- The value parsers and formatters, exposed for tests. ---

// Decimal bytes with an optional unit: B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB, any case, all
// powers of 1024, optionally one space before the unit. At most 2^63 - 1 bytes.
bool parseSize(std::string_view text, uint64_t& bytes);
// A decimal number (digits, optionally '.' and digits), optionally one space, then '%'; it must
// be above 0 and at most 100.
bool parsePercent(std::string_view text, double& percent);
// A size or a percentage, as above.
bool parseSizeSpec(std::string_view text, SizeSpec& spec);
// 0/1, true/false, yes/no, on/off, any case.
bool parseBool(std::string_view text, bool& value);

// "6GiB" when a whole number of the largest such unit, else plain bytes ("1000").
std::string formatSize(uint64_t bytes);
// "90%", "12.5%": the shortest text that reads back as the same double.
std::string formatPercent(double percent);
std::string formatSizeSpec(const SizeSpec& spec);
// For messages: "80.0 GiB", "512.0 MiB", "12.0 KiB", "100 bytes".
std::string formatMemory(uint64_t bytes);

// Edit distance (Levenshtein, ASCII case folded), for the "did you mean" suggestion.
std::size_t editDistance(std::string_view a, std::string_view b);

// MemTotal from a /proc/meminfo-style file, in bytes; 0 when unreadable or absent. Uses
// open/read into a stack buffer: safe early in a foreign process.
uint64_t readHostMemoryBytes(const char* meminfoPath = "/proc/meminfo");

}  // namespace delta::shim
