// DELTA's options table and its parsers: see options.h. The table below is the only list of
// DELTA_* variables; the README's table, the verbose listing and the error messages all come
// from it. Runs once at start inside a foreign process: no exceptions, no locale-dependent
// calls (the host program may have called setlocale), no getenv (the caller passes environ).
#include "shim/options.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bitset>
#include <cerrno>
#include <charconv>
#include <span>
#include <system_error>
#include <utility>
#include <vector>

#include "policy/policy_factory.h"

namespace delta::shim {

namespace {

constexpr std::string_view kPrefix = "libdelta: ";
constexpr std::string_view kVarPrefix = "DELTA_";
constexpr uint64_t kMaxBytes = uint64_t{1} << 63;  // exclusive: sizes stay int64-safe
constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kTiB = uint64_t{1} << 40;
// Values echoed in messages are cut here: an error must stay one readable line.
constexpr std::size_t kMaxEchoedValue = 80;
// Policies the factory knows but the shim cannot run: they read the future, which only the
// replay simulator has (makePolicy fails for them without one; options_test checks this).
constexpr std::array<std::string_view, 1> kReplayOnlyPolicies = {"belady"};

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }
bool isDigit(char c) { return c >= '0' && c <= '9'; }

bool equalsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

bool isReplayOnly(std::string_view name) {
  return std::find(kReplayOnlyPolicies.begin(), kReplayOnlyPolicies.end(), name) !=
         kReplayOnlyPolicies.end();
}

// Replaces "{policies}" with the online policy names.
std::string expand(std::string_view text) {
  constexpr std::string_view kPlaceholder = "{policies}";
  std::string out;
  std::size_t at = text.find(kPlaceholder);
  if (at == std::string_view::npos) return std::string(text);
  out.append(text.substr(0, at));
  out += onlinePolicyNames();
  out.append(text.substr(at + kPlaceholder.size()));
  return out;
}

// `value` with control bytes and backslashes written as \xNN, so that it cannot break a line.
std::string printable(std::string_view value) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (char ch : value) {
    auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f || c == '\\') {
      out += '\\';
      out += 'x';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += ch;
    }
  }
  return out;
}

// A value as it appears in a message: quoted, escaped, long values cut, so that the message is
// one line whatever the environment holds.
std::string echo(std::string_view value) {
  std::string out = "'";
  out += printable(value.substr(0, kMaxEchoedValue));
  if (value.size() > kMaxEchoedValue) out += "...";
  out += "'";
  return out;
}

// A variable's name as it appears in a message: same escaping, no quotes.
std::string echoName(std::string_view name) {
  std::string quoted = echo(name);
  return quoted.substr(1, quoted.size() - 2);
}

// --- Row parsers: each sets its member or returns false; `why` (optional) is said before
// "expected ...", for the cases where the plain "not valid" would puzzle. ---

using ParseFn = bool (*)(std::string_view value, Options& options, std::string& why);
using FormatFn = std::string (*)(const Options& options);

bool parseBudget(std::string_view v, Options& o, std::string& why) {
  if (!parseSizeSpec(v, o.budget)) return false;
  if (!o.budget.isPercent && o.budget.bytes == 0) {
    why = "a zero budget cannot hold any launch";
    return false;
  }
  return true;
}

bool parsePolicy(std::string_view v, Options& o, std::string& why) {
  for (std::string_view name : policy::policyNames()) {
    if (name != v) continue;
    if (isReplayOnly(name)) {
      why = "policy '" + std::string(name) +
            "' needs the future and runs only in the replay simulator (delta-trace)";
      return false;
    }
    o.policy = std::string(v);
    return true;
  }
  return false;
}

bool parseTrace(std::string_view v, Options& o, std::string&) {
  o.tracePath = std::string(v);
  return true;
}

bool parseTraceStacks(std::string_view v, Options& o, std::string&) {
  return parseBool(v, o.traceStacks);
}

bool parseTraceOverwrite(std::string_view v, Options& o, std::string&) {
  return parseBool(v, o.traceOverwrite);
}

bool parseHostLimit(std::string_view v, Options& o, std::string& why) {
  if (!parseSizeSpec(v, o.hostLimit)) return false;
  if (!o.hostLimit.isPercent && o.hostLimit.bytes == 0) {
    // Zero would make every swap fail at run time; say how to get what was probably meant.
    why = "a zero host limit leaves nowhere to page buffers to (for no paging use "
          "DELTA_POLICY=recompute-only)";
    return false;
  }
  return true;
}

bool parseMinBytes(std::string_view v, Options& o, std::string&) {
  return parseSize(v, o.minBytes);
}

bool parseVerbose(std::string_view v, Options& o, std::string&) {
  if (v.size() != 1 || v[0] < '0' || v[0] > '2') return false;
  o.verbose = v[0] - '0';
  return true;
}

bool parseDisable(std::string_view v, Options& o, std::string&) { return parseBool(v, o.disabled); }
bool parseStrict(std::string_view v, Options& o, std::string&) { return parseBool(v, o.strict); }

bool parseCuptiPath(std::string_view v, Options& o, std::string&) {
  o.cuptiPath = std::string(v);
  return true;
}

bool parseMode(std::string_view v, Options& o, std::string&) {
  if (v == "vmm") {
    o.mode = Options::Mode::kVmm;
  } else if (v == "uvm") {
    o.mode = Options::Mode::kUvm;
  } else {
    return false;
  }
  return true;
}

bool parsePrefetch(std::string_view v, Options& o, std::string&) {
  return parseBool(v, o.prefetch);
}

bool parsePlan(std::string_view v, Options& o, std::string&) {
  return parseBool(v, o.plan);
}

std::string formatBool(bool b) { return b ? "1" : "0"; }

// One row: what users and docs see, and how the value is read and shown.
struct Row {
  OptionInfo info;
  ParseFn parse;
  FormatFn format;
};

constexpr std::string_view kSizeAccepted =
    "a size such as 6GiB (B, K, M, G, T; KB/KiB etc. are also powers of 1024)";
constexpr std::string_view kBoolAccepted = "0, 1, true, false, yes, no, on or off";

// THE table. Order is the order of the docs and of the verbose listing. Defaults are written as a
// user would write them and parsed at every start, so they cannot disagree with the parsers
// (options_test also parses each one).
constexpr std::array<Row, 14> kTable = {{
    {{"DELTA_BUDGET", "90%",
      "Most device memory the managed buffers may hold at once: a size (`6GiB`) or a percentage "
      "of the device's memory (`90%`).",
      "a size such as 6GiB or a percentage of device memory such as 50%"},
     parseBudget, [](const Options& o) { return formatSizeSpec(o.budget); }},
    {{"DELTA_POLICY", "delta",
      "Eviction policy: one of {policies}. (`belady` needs the future: replay only.)",
      "one of {policies}"},
     parsePolicy, [](const Options& o) { return o.policy; }},
    {{"DELTA_TRACE", "",
      "Trace file to write; `%p` is replaced by the process id, `%r` by the rank. Empty: no "
      "trace.",
      "a file path"},
     parseTrace, [](const Options& o) { return o.tracePath; }},
    {{"DELTA_TRACE_STACKS", "0",
      "Record each managed allocation's call stack in `DELTA_TRACE` (libunwind, else glibc's "
      "`backtrace`); `delta-trace summary` ranks the sites.",
      kBoolAccepted},
     parseTraceStacks, [](const Options& o) { return formatBool(o.traceStacks); }},
    {{"DELTA_TRACE_OVERWRITE", "0",
      "Let `DELTA_TRACE` overwrite an existing file that is not a DELTA trace.", kBoolAccepted},
     parseTraceOverwrite, [](const Options& o) { return formatBool(o.traceOverwrite); }},
    {{"DELTA_HOST_LIMIT", "50%",
      "Most pinned host memory for evicted buffers: a size or a percentage of host memory "
      "(`MemTotal` in `/proc/meminfo`).",
      "a size such as 16GiB or a percentage of host memory such as 50%"},
     parseHostLimit, [](const Options& o) { return formatSizeSpec(o.hostLimit); }},
    {{"DELTA_MIN_BYTES", "1MiB", "Allocations smaller than this size are left unmanaged.",
      kSizeAccepted},
     parseMinBytes, [](const Options& o) { return formatSize(o.minBytes); }},
    {{"DELTA_VERBOSE", "0",
      "`0`: errors only; `1`: print the options in force at start and a one-screen summary at "
      "exit; `2`: also diagnostics while running.",
      "0, 1 or 2"},
     parseVerbose, [](const Options& o) { return std::to_string(o.verbose); }},
    {{"DELTA_DISABLE", "0",
      "Off switch: pass every call through untouched (the other `DELTA_` variables are then "
      "not checked).",
      kBoolAccepted},
     parseDisable, [](const Options& o) { return formatBool(o.disabled); }},
    {{"DELTA_STRICT", "0",
      "A launch whose working set exceeds the budget fails with the driver's out-of-memory "
      "error instead of running over budget.",
      kBoolAccepted},
     parseStrict, [](const Options& o) { return formatBool(o.strict); }},
    {{"DELTA_CUPTI_PATH", "", "Path to `libcupti.so`. Empty: search the usual places.",
      "a file path"},
     parseCuptiPath, [](const Options& o) { return o.cuptiPath; }},
    {{"DELTA_MODE", "vmm",
      "`vmm`: manage buffers with the driver's virtual memory calls; `uvm`: the Unified Memory "
      "baseline, managed memory that the driver pages (`docs/options.md`).",
      "vmm or uvm"},
     parseMode,
     [](const Options& o) {
       return std::string(o.mode == Options::Mode::kUvm ? "uvm" : "vmm");
     }},
    {{"DELTA_PREFETCH", "1", "Start restores ahead of use when the policy predicts them.",
      kBoolAccepted},
     parsePrefetch, [](const Options& o) { return formatBool(o.prefetch); }},
    {{"DELTA_PLAN", "0",
      "1: delta plans each iteration it learns within the budget, on a background thread "
      "(experimental: it learns the host's launch times, not the GPU's, and can plan worse than "
      "not planning).",
      kBoolAccepted},
     parsePlan, [](const Options& o) { return formatBool(o.plan); }},
}};

// Rows the parser and resolver treat specially, checked against their names.
constexpr std::size_t kBudgetRow = 0;
constexpr std::size_t kHostLimitRow = 5;
constexpr std::size_t kDisableRow = 8;
static_assert(kTable[kBudgetRow].info.name == "DELTA_BUDGET");
static_assert(kTable[kHostLimitRow].info.name == "DELTA_HOST_LIMIT");
static_assert(kTable[kDisableRow].info.name == "DELTA_DISABLE");

// The table's names are unique, upper case and DELTA_-prefixed: checked at compile time.
constexpr bool tableIsWellFormed() {
  for (std::size_t i = 0; i < kTable.size(); ++i) {
    std::string_view name = kTable[i].info.name;
    if (name.substr(0, kVarPrefix.size()) != kVarPrefix || name.size() == kVarPrefix.size()) {
      return false;
    }
    for (char c : name) {
      if (!((c >= 'A' && c <= 'Z') || c == '_')) return false;
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (kTable[j].info.name == name) return false;
    }
  }
  return true;
}
static_assert(tableIsWellFormed());

std::string invalid(const Row& row, std::string_view value, const std::string& why) {
  std::string line(kPrefix);
  line += row.info.name;
  line += '=';
  line += echo(value);
  line += " is not valid: ";
  if (!why.empty()) line += why + "; ";
  line += "expected ";
  line += expand(row.info.accepted);
  return line;
}

std::string unknownVariable(std::string_view name, std::string_view value) {
  std::string line(kPrefix);
  line += echoName(name);
  line += '=';
  line += echo(value);
  line += " is not a DELTA option";
  // The closest known name within distance 2; ties go to the first in table order.
  const Row* best = nullptr;
  std::size_t bestDistance = 3;
  for (const Row& row : kTable) {
    std::size_t longer = std::max(name.size(), row.info.name.size());
    std::size_t shorter = std::min(name.size(), row.info.name.size());
    if (longer - shorter >= bestDistance) continue;  // cheap bound: names can be any length
    std::size_t d = editDistance(name, row.info.name);
    if (d < bestDistance) {
      bestDistance = d;
      best = &row;
    }
  }
  if (best != nullptr) {
    line += ": did you mean ";
    line += best->info.name;
    line += '?';
  } else {
    line += ": expected one of ";
    for (std::size_t i = 0; i < kTable.size(); ++i) {
      if (i > 0) line += ", ";
      line += kTable[i].info.name;
    }
  }
  return line;
}

// The options with every row at its default. The defaults are the table's own, so failing here
// is a bug in the table (caught by options_test), reported like any other bad value.
bool defaults(Options& options, std::string& error) {
  options = Options{};
  for (const Row& row : kTable) {
    std::string why;
    if (!row.parse(row.info.defaultValue, options, why)) {
      error = invalid(row, row.info.defaultValue, why) + " (bad default: a bug in libdelta)";
      return false;
    }
  }
  return true;
}

// Integer tenths of `bytes / unit`, rounded, without overflow: "80.0".
std::string tenths(uint64_t bytes, uint64_t unit) {
  uint64_t whole = bytes / unit;
  uint64_t rest = ((bytes % unit) * 10 + unit / 2) / unit;  // bytes % unit < 2^40: no overflow
  if (rest == 10) {
    ++whole;
    rest = 0;
  }
  return std::to_string(whole) + '.' + static_cast<char>('0' + rest);
}

// floor(total * percent / 100), at most total. long double keeps 64 bits of mantissa: exact
// for memory sizes up to 2^57 or so, a few bytes off beyond; 100% is exact whatever the size.
uint64_t percentOf(uint64_t total, double percent) {
  if (percent >= 100) return total;
  long double exact = static_cast<long double>(total) * percent / 100.0L;
  if (exact >= static_cast<long double>(total)) return total;
  if (exact <= 0) return 0;
  return static_cast<uint64_t>(exact);
}

// One of the resolve checks: spec against a total ("device", "host"); 0 total: unknown.
bool resolveOne(const Row& row, const SizeSpec& spec, uint64_t total, std::string_view whose,
                uint64_t& out, std::string& error) {
  std::string head = std::string(kPrefix) + std::string(row.info.name) + "=" +
                     echo(formatSizeSpec(spec));
  if (spec.isPercent) {
    if (total == 0) {
      error = head + " cannot be resolved: the " + std::string(whose) +
              "'s memory size is unknown; set a size such as 16GiB instead";
      return false;
    }
    out = percentOf(total, spec.percent);
    if (out == 0) {
      error = head + " is 0 bytes of the " + std::string(whose) + "'s " + formatMemory(total) +
              " of memory; expected a larger percentage";
      return false;
    }
    return true;
  }
  if (total != 0 && spec.bytes > total) {
    error = head + " is more than the " + std::string(whose) + "'s " + formatMemory(total) +
            " of memory";
    return false;
  }
  out = spec.bytes;
  return true;
}

}  // namespace

std::size_t optionCount() { return kTable.size(); }

const OptionInfo& optionInfo(std::size_t index) { return kTable[index].info; }

std::string onlinePolicyNames() {
  std::string out;
  for (std::string_view name : policy::policyNames()) {
    if (isReplayOnly(name)) continue;
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

bool parseSize(std::string_view text, uint64_t& bytes) {
  std::size_t i = 0;
  uint64_t value = 0;
  while (i < text.size() && isDigit(text[i])) {
    uint64_t digit = static_cast<uint64_t>(text[i] - '0');
    if (value > (kMaxBytes - 1 - digit) / 10) return false;  // past 2^63 - 1
    value = value * 10 + digit;
    ++i;
  }
  if (i == 0) return false;  // empty, sign, '.', space or letters first
  std::string_view unit = text.substr(i);
  if (!unit.empty() && unit[0] == ' ') unit.remove_prefix(1);  // "6 GiB"; not "6 " nor "6  G"
  if (unit.empty() && i < text.size()) return false;           // trailing space alone
  uint64_t multiplier = 1;
  if (!unit.empty()) {
    // The letter picks the power; the rest must be nothing, "B" or "iB" (any case). KB and KiB
    // both mean 1024: memory is sized in binary units, and a budget 2.4 % off from what the
    // user meant by "GB" is worse than one nobody can misread (documented in docs/options.md).
    char letter = lower(unit[0]);
    std::string_view tail = unit.substr(1);
    if (letter == 'b' && tail.empty()) {
      multiplier = 1;
    } else {
      switch (letter) {
        case 'k': multiplier = kKiB; break;
        case 'm': multiplier = kMiB; break;
        case 'g': multiplier = kGiB; break;
        case 't': multiplier = kTiB; break;
        default: return false;
      }
      if (!(tail.empty() || equalsIgnoreCase(tail, "b") || equalsIgnoreCase(tail, "ib"))) {
        return false;
      }
    }
  }
  if (value > (kMaxBytes - 1) / multiplier) return false;
  bytes = value * multiplier;
  return true;
}

bool parsePercent(std::string_view text, double& percent) {
  if (text.empty() || text.back() != '%') return false;
  std::string_view number = text.substr(0, text.size() - 1);
  if (!number.empty() && number.back() == ' ') number.remove_suffix(1);  // "50 %"
  // Plain decimal only: from_chars alone would also take "inf", "nan", "1e2" and hex floats.
  std::size_t i = 0;
  while (i < number.size() && isDigit(number[i])) ++i;
  if (i == 0) return false;
  if (i < number.size() && number[i] == '.') {
    std::size_t fractionStart = ++i;
    while (i < number.size() && isDigit(number[i])) ++i;
    if (i == fractionStart) return false;  // "50.%"
  }
  if (i != number.size()) return false;
  double value = 0;
  // from_chars: locale-independent, unlike strtod (the host program may use a ',' locale).
  auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value,
                                   std::chars_format::fixed);
  if (ec != std::errc() || end != number.data() + number.size()) return false;
  if (!(value > 0 && value <= 100)) return false;
  percent = value;
  return true;
}

bool parseSizeSpec(std::string_view text, SizeSpec& spec) {
  SizeSpec parsed;
  if (!text.empty() && text.back() == '%') {
    if (!parsePercent(text, parsed.percent)) return false;
    parsed.isPercent = true;
  } else if (!parseSize(text, parsed.bytes)) {
    return false;
  }
  spec = parsed;
  return true;
}

bool parseBool(std::string_view text, bool& value) {
  static constexpr std::array<std::string_view, 4> kTrue = {"1", "true", "yes", "on"};
  static constexpr std::array<std::string_view, 4> kFalse = {"0", "false", "no", "off"};
  for (std::string_view t : kTrue) {
    if (equalsIgnoreCase(text, t)) {
      value = true;
      return true;
    }
  }
  for (std::string_view f : kFalse) {
    if (equalsIgnoreCase(text, f)) {
      value = false;
      return true;
    }
  }
  return false;
}

std::string formatSize(uint64_t bytes) {
  static constexpr std::array<std::pair<uint64_t, std::string_view>, 4> kUnits = {{
      {kTiB, "TiB"}, {kGiB, "GiB"}, {kMiB, "MiB"}, {kKiB, "KiB"}}};
  if (bytes != 0) {
    for (const auto& [unit, suffix] : kUnits) {
      if (bytes % unit == 0) return std::to_string(bytes / unit) + std::string(suffix);
    }
  }
  return std::to_string(bytes);
}

std::string formatPercent(double percent) {
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, percent);
  if (ec != std::errc()) return "?%";
  return std::string(buffer, end) + '%';
}

std::string formatSizeSpec(const SizeSpec& spec) {
  return spec.isPercent ? formatPercent(spec.percent) : formatSize(spec.bytes);
}

std::string formatMemory(uint64_t bytes) {
  if (bytes >= kGiB) return tenths(bytes, kGiB) + " GiB";
  if (bytes >= kMiB) return tenths(bytes, kMiB) + " MiB";
  if (bytes >= kKiB) return tenths(bytes, kKiB) + " KiB";
  return std::to_string(bytes) + (bytes == 1 ? " byte" : " bytes");
}

std::size_t editDistance(std::string_view a, std::string_view b) {
  // Two rows of the classic dynamic-programming table.
  std::vector<std::size_t> prev(b.size() + 1, 0);
  std::vector<std::size_t> cur(b.size() + 1, 0);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t substitute = prev[j - 1] + (lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, substitute});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

bool parseOptions(char* const* environment, Options& options, std::string& error) {
  Options parsed;
  if (!defaults(parsed, error)) return false;

  // First occurrence of each known variable (as getenv would see it), and the first unknown.
  std::array<std::string_view, kTable.size()> values{};
  std::bitset<kTable.size()> seen;
  std::string_view unknownName;
  std::string_view unknownValue;
  bool haveUnknown = false;
  for (char* const* entry = environment; entry != nullptr && *entry != nullptr; ++entry) {
    std::string_view text(*entry);
    if (text.substr(0, kVarPrefix.size()) != kVarPrefix) continue;
    std::size_t equals = text.find('=');
    if (equals == std::string_view::npos) continue;  // not a variable: putenv'd garbage
    std::string_view name = text.substr(0, equals);
    std::string_view value = text.substr(equals + 1);
    bool known = false;
    for (std::size_t i = 0; i < kTable.size(); ++i) {
      if (kTable[i].info.name != name) continue;
      known = true;
      if (!seen[i]) {
        seen[i] = true;
        values[i] = value;
      }
      break;
    }
    if (!known && !haveUnknown) {
      haveUnknown = true;
      unknownName = name;
      unknownValue = value;
    }
  }

  // The off switch first: when valid and on, nothing else may stop the job.
  if (seen[kDisableRow]) {
    const Row& row = kTable[kDisableRow];
    std::string why;
    if (!row.parse(values[kDisableRow], parsed, why)) {
      error = invalid(row, values[kDisableRow], why);
      return false;
    }
    if (parsed.disabled) {
      options = std::move(parsed);
      return true;
    }
  }

  // A misspelt name first: its value was meant for a known option, which then looks fine.
  if (haveUnknown) {
    error = unknownVariable(unknownName, unknownValue);
    return false;
  }
  for (std::size_t i = 0; i < kTable.size(); ++i) {
    if (!seen[i]) continue;
    std::string why;
    if (!kTable[i].parse(values[i], parsed, why)) {
      error = invalid(kTable[i], values[i], why);
      return false;
    }
  }
  options = std::move(parsed);
  return true;
}

bool resolveOptions(const Options& options, uint64_t deviceBytes, uint64_t hostBytes,
                    uint64_t& budgetBytes, uint64_t& hostLimitBytes, std::string& error) {
  if (deviceBytes == 0) {
    error = std::string(kPrefix) + "DELTA_BUDGET cannot be checked: the device's memory size is " +
            "unknown (0 bytes reported)";
    return false;
  }
  uint64_t budget = 0;
  uint64_t hostLimit = 0;
  if (!resolveOne(kTable[kBudgetRow], options.budget, deviceBytes, "device", budget, error)) return false;
  if (!resolveOne(kTable[kHostLimitRow], options.hostLimit, hostBytes, "host", hostLimit, error)) return false;
  budgetBytes = budget;
  hostLimitBytes = hostLimit;
  return true;
}

std::string describeOptions(const Options& options) {
  std::string out;
  Options defaultOptions;
  std::string ignored;
  bool haveDefaults = defaults(defaultOptions, ignored);
  for (const Row& row : kTable) {
    // Paths are printed escaped: one option, one line, whatever the environment held.
    std::string value = printable(row.format(options));
    // Compare canonical forms: "1048576" and "1MiB" are the same default.
    std::string defaultValue =
        printable(haveDefaults ? row.format(defaultOptions) : std::string(row.info.defaultValue));
    out += kPrefix;
    out += row.info.name;
    out += '=';
    out += value.empty() ? std::string("''") : value;
    if (value == defaultValue) {
      out += " (default)\n";
    } else {
      out += " (default: ";
      out += defaultValue.empty() ? std::string("''") : defaultValue;
      out += ")\n";
    }
  }
  return out;
}

std::string optionsMarkdownTable() {
  std::string out = "| variable | default | meaning |\n|---|---|---|\n";
  for (const Row& row : kTable) {
    out += "| `";
    out += row.info.name;
    out += "` | ";
    if (row.info.defaultValue.empty()) {
      out += "empty";
    } else {
      out += '`';
      out += row.info.defaultValue;
      out += '`';
    }
    out += " | ";
    out += expand(row.info.meaning);
    out += " |\n";
  }
  return out;
}

uint64_t readHostMemoryBytes(const char* meminfoPath) {
  // MemTotal is the first line of /proc/meminfo; 4 KiB is plenty and keeps this off the heap.
  char buffer[4096];
  int fd = ::open(meminfoPath, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  std::size_t length = 0;
  while (length < sizeof buffer) {
    ssize_t n = ::read(fd, buffer + length, sizeof buffer - length);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    length += static_cast<std::size_t>(n);
  }
  ::close(fd);
  std::string_view text(buffer, length);
  constexpr std::string_view kKey = "MemTotal:";
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    std::string_view line = text.substr(at, end == std::string_view::npos ? end : end - at);
    if (line.substr(0, kKey.size()) == kKey) {
      line.remove_prefix(kKey.size());
      while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
      uint64_t kib = 0;
      auto [numberEnd, ec] = std::from_chars(line.data(), line.data() + line.size(), kib);
      if (ec != std::errc() || kib > (kMaxBytes - 1) / kKiB) return 0;
      std::string_view unit(numberEnd, static_cast<std::size_t>(line.data() + line.size() - numberEnd));
      // The kernel writes "kB", meaning KiB.
      return unit == " kB" ? kib * kKiB : 0;
    }
    if (end == std::string_view::npos) break;
    at = end + 1;
  }
  return 0;
}

}  // namespace delta::shim
