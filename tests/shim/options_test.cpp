// Tests for shim/options: the DELTA_* table, its value parsers, the unknown-variable check, the
// second-stage resolve, the verbose listing, and that docs/options.md and README.md carry the
// table as the code has it. Table-driven: one row per case.
#include "shim/options.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

#include "policy/policy_factory.h"
#include "tests/shim/options_doc.h"

namespace delta::shim {
namespace {

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kTiB = uint64_t{1} << 40;

// An environment like `environ`, owning its strings.
class Env {
 public:
  Env(std::initializer_list<std::string> entries) : entries_(entries) {
    for (std::string& e : entries_) pointers_.push_back(e.data());
    pointers_.push_back(nullptr);
  }
  char* const* get() { return pointers_.data(); }

 private:
  std::vector<std::string> entries_;
  std::vector<char*> pointers_;
};

struct Parsed {
  bool ok = false;
  Options options;
  std::string error;
};

Parsed parse(std::initializer_list<std::string> entries) {
  Env env(entries);
  Parsed p;
  p.ok = parseOptions(env.get(), p.options, p.error);
  return p;
}

const OptionInfo* findInfo(std::string_view name) {
  for (std::size_t i = 0; i < optionCount(); ++i) {
    if (optionInfo(i).name == name) return &optionInfo(i);
  }
  return nullptr;
}

// The value describeOptions shows for `name`: "6GiB" from "libdelta: DELTA_BUDGET=6GiB (...)".
std::string shownValue(const Options& options, std::string_view name) {
  std::string text = describeOptions(options);
  std::string key = "libdelta: " + std::string(name) + "=";
  std::size_t at = text.find(key);
  if (at == std::string::npos) return "<missing>";
  std::size_t end = text.find(" (default", at);
  return text.substr(at + key.size(), end - at - key.size());
}

std::string expanded(std::string_view text) {
  std::string out(text);
  std::size_t at = out.find("{policies}");
  if (at != std::string::npos) out.replace(at, 10, onlinePolicyNames());
  return out;
}

// --- The table itself. ---

TEST(OptionsTable, HasTheIssuesOptionsInOrder) {
  const std::vector<std::string_view> expected = {
      "DELTA_BUDGET",    "DELTA_POLICY",  "DELTA_TRACE",  "DELTA_TRACE_STACKS",
      "DELTA_TRACE_OVERWRITE", "DELTA_HOST_LIMIT", "DELTA_MIN_BYTES", "DELTA_VERBOSE",
      "DELTA_DISABLE",   "DELTA_STRICT",  "DELTA_CUPTI_PATH", "DELTA_MODE", "DELTA_PREFETCH",
      "DELTA_PLAN"};
  ASSERT_EQ(optionCount(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(optionInfo(i).name, expected[i]);
    EXPECT_FALSE(optionInfo(i).meaning.empty()) << expected[i];
    EXPECT_FALSE(optionInfo(i).accepted.empty()) << expected[i];
  }
}

TEST(OptionsTable, EmptyEnvironmentGivesTheDefaults) {
  for (bool null : {false, true}) {
    Options o;
    std::string error;
    Env empty({});
    ASSERT_TRUE(parseOptions(null ? nullptr : empty.get(), o, error)) << error;
    EXPECT_TRUE(o.budget.isPercent);
    EXPECT_EQ(o.budget.percent, 90.0);
    EXPECT_EQ(o.policy, "delta");
    EXPECT_EQ(o.policy, policy::kDefaultPolicy);
    EXPECT_EQ(o.tracePath, "");
    EXPECT_FALSE(o.traceStacks);
    EXPECT_FALSE(o.traceOverwrite);
    EXPECT_TRUE(o.hostLimit.isPercent);
    EXPECT_EQ(o.hostLimit.percent, 50.0);
    EXPECT_EQ(o.minBytes, kMiB);
    EXPECT_EQ(o.verbose, 0);
    EXPECT_FALSE(o.disabled);
    EXPECT_FALSE(o.strict);
    EXPECT_EQ(o.cuptiPath, "");
    EXPECT_EQ(o.mode, Options::Mode::kVmm);
    EXPECT_TRUE(o.prefetch);
  }
}

TEST(OptionsTable, EachDefaultIsAcceptedWhenWrittenOut) {
  for (std::size_t i = 0; i < optionCount(); ++i) {
    const OptionInfo& info = optionInfo(i);
    Parsed p = parse({std::string(info.name) + "=" + std::string(info.defaultValue)});
    EXPECT_TRUE(p.ok) << p.error;
    EXPECT_NE(describeOptions(p.options).find(std::string(info.name) + "="), std::string::npos);
  }
}

// The shim runs exactly the policies the factory can build without the future.
TEST(OptionsTable, PolicyNamesComeFromTheFactory) {
  policy::PolicyConfig tiny;
  tiny.max_buffers = 4;
  tiny.max_launches = 4;
  tiny.max_uses = 4;
  std::string online = onlinePolicyNames();
  EXPECT_EQ(online, "delta, lru, dtr, swap-only, recompute-only");
  for (std::string_view name : policy::policyNames()) {
    bool listed = (", " + online + ",").find(", " + std::string(name) + ",") != std::string::npos;
    policy::PolicyResult made = policy::makePolicy(name, tiny, nullptr);
    EXPECT_EQ(listed, made.policy != nullptr) << name << ": " << made.error;
    Parsed p = parse({"DELTA_POLICY=" + std::string(name)});
    EXPECT_EQ(p.ok, listed) << name << ": " << p.error;
    if (listed) {
      EXPECT_EQ(p.options.policy, name);
    }
  }
}

// --- Valid values: each is shown back in its canonical form. ---

struct ValidCase {
  const char* name;
  const char* value;
  const char* shown;  // describeOptions' value
};

const ValidCase kValid[] = {
    {"DELTA_BUDGET", "6GiB", "6GiB"},
    {"DELTA_BUDGET", "6G", "6GiB"},
    {"DELTA_BUDGET", "6gb", "6GiB"},
    {"DELTA_BUDGET", "6 GiB", "6GiB"},
    {"DELTA_BUDGET", "6442450944", "6GiB"},
    {"DELTA_BUDGET", "1536MiB", "1536MiB"},
    {"DELTA_BUDGET", "1000", "1000"},
    {"DELTA_BUDGET", "1", "1"},
    {"DELTA_BUDGET", "2t", "2TiB"},
    {"DELTA_BUDGET", "50%", "50%"},
    {"DELTA_BUDGET", "12.5%", "12.5%"},
    {"DELTA_BUDGET", "12.5 %", "12.5%"},
    {"DELTA_BUDGET", "100%", "100%"},
    {"DELTA_BUDGET", "0.5%", "0.5%"},
    {"DELTA_BUDGET", "007%", "7%"},
    {"DELTA_POLICY", "delta", "delta"},
    {"DELTA_POLICY", "lru", "lru"},
    {"DELTA_POLICY", "dtr", "dtr"},
    {"DELTA_POLICY", "swap-only", "swap-only"},
    {"DELTA_POLICY", "recompute-only", "recompute-only"},
    {"DELTA_TRACE", "", "''"},
    {"DELTA_TRACE", "/tmp/delta-%p-%r.trace", "/tmp/delta-%p-%r.trace"},
    {"DELTA_TRACE", "run 1.trace", "run 1.trace"},
    {"DELTA_TRACE_STACKS", "1", "1"},
    {"DELTA_TRACE_STACKS", "yes", "1"},
    {"DELTA_TRACE_STACKS", "FALSE", "0"},
    {"DELTA_TRACE_OVERWRITE", "On", "1"},
    {"DELTA_TRACE_OVERWRITE", "off", "0"},
    {"DELTA_HOST_LIMIT", "16GiB", "16GiB"},
    {"DELTA_HOST_LIMIT", "25%", "25%"},
    {"DELTA_HOST_LIMIT", "64 kb", "64KiB"},
    {"DELTA_MIN_BYTES", "0", "0"},
    {"DELTA_MIN_BYTES", "4096", "4KiB"},
    {"DELTA_MIN_BYTES", "2M", "2MiB"},
    {"DELTA_MIN_BYTES", "1048576", "1MiB"},
    {"DELTA_MIN_BYTES", "512B", "512"},
    {"DELTA_VERBOSE", "0", "0"},
    {"DELTA_VERBOSE", "1", "1"},
    {"DELTA_VERBOSE", "2", "2"},
    {"DELTA_DISABLE", "0", "0"},
    {"DELTA_DISABLE", "no", "0"},
    {"DELTA_STRICT", "true", "1"},
    {"DELTA_STRICT", "0", "0"},
    {"DELTA_CUPTI_PATH", "", "''"},
    {"DELTA_CUPTI_PATH", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so",
     "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so"},
    {"DELTA_MODE", "vmm", "vmm"},
    {"DELTA_MODE", "uvm", "uvm"},
    {"DELTA_PREFETCH", "0", "0"},
    {"DELTA_PREFETCH", "ON", "1"},
    {"DELTA_PLAN", "1", "1"},
    {"DELTA_PLAN", "off", "0"},
};

TEST(OptionsParse, ValidValues) {
  for (const ValidCase& c : kValid) {
    Parsed p = parse({std::string(c.name) + "=" + c.value});
    ASSERT_TRUE(p.ok) << c.name << "=" << c.value << ": " << p.error;
    EXPECT_EQ(shownValue(p.options, c.name), c.shown) << c.name << "=" << c.value;
  }
}

TEST(OptionsParse, ValidValuesSetTheMembers) {
  Parsed p = parse({"DELTA_BUDGET=6GiB", "DELTA_POLICY=lru", "DELTA_TRACE=/t/%p.trace",
                    "DELTA_TRACE_STACKS=1", "DELTA_TRACE_OVERWRITE=1", "DELTA_HOST_LIMIT=12.5%",
                    "DELTA_MIN_BYTES=64K", "DELTA_VERBOSE=2", "DELTA_STRICT=1",
                    "DELTA_CUPTI_PATH=/x/libcupti.so", "DELTA_MODE=uvm", "DELTA_PREFETCH=0",
                    "DELTA_PLAN=1"});
  ASSERT_TRUE(p.ok) << p.error;
  const Options& o = p.options;
  EXPECT_FALSE(o.budget.isPercent);
  EXPECT_EQ(o.budget.bytes, 6 * kGiB);
  EXPECT_EQ(o.policy, "lru");
  EXPECT_EQ(o.tracePath, "/t/%p.trace");
  EXPECT_TRUE(o.traceStacks);
  EXPECT_TRUE(o.traceOverwrite);
  EXPECT_TRUE(o.hostLimit.isPercent);
  EXPECT_EQ(o.hostLimit.percent, 12.5);
  EXPECT_EQ(o.minBytes, 64 * kKiB);
  EXPECT_EQ(o.verbose, 2);
  EXPECT_FALSE(o.disabled);
  EXPECT_TRUE(o.strict);
  EXPECT_EQ(o.cuptiPath, "/x/libcupti.so");
  EXPECT_EQ(o.mode, Options::Mode::kUvm);
  EXPECT_FALSE(o.prefetch);
  EXPECT_TRUE(o.plan);
}

// Every option has at least one valid case above.
TEST(OptionsParse, EveryOptionHasValidCases) {
  for (std::size_t i = 0; i < optionCount(); ++i) {
    bool found = false;
    for (const ValidCase& c : kValid) found = found || optionInfo(i).name == c.name;
    EXPECT_TRUE(found) << optionInfo(i).name;
  }
}

// --- Invalid values: one line naming the variable, the value and what is accepted. ---

struct InvalidCase {
  const char* name;
  std::string value;
  const char* why;  // said before "expected", or "" for none
};

const InvalidCase kInvalid[] = {
    // Sizes, and the budget's own rules.
    {"DELTA_BUDGET", "", ""},
    {"DELTA_BUDGET", "12 parsecs", ""},
    {"DELTA_BUDGET", "-1", ""},
    {"DELTA_BUDGET", "-6GiB", ""},
    {"DELTA_BUDGET", "+6GiB", ""},
    {"DELTA_BUDGET", "0", "a zero budget cannot hold any launch"},
    {"DELTA_BUDGET", "0GiB", "a zero budget cannot hold any launch"},
    {"DELTA_BUDGET", "9223372036854775808", ""},   // 2^63
    {"DELTA_BUDGET", "18446744073709551616", ""},  // 2^64
    {"DELTA_BUDGET", "99999999999999999999999", ""},
    {"DELTA_BUDGET", "8388608T", ""},  // 2^63 bytes
    {"DELTA_BUDGET", "10 GB GB", ""},
    {"DELTA_BUDGET", "10GBB", ""},
    {"DELTA_BUDGET", "10GiBs", ""},
    {"DELTA_BUDGET", "10Gi", ""},
    {"DELTA_BUDGET", "10 ", ""},
    {"DELTA_BUDGET", " 10", ""},
    {"DELTA_BUDGET", "10  G", ""},
    {"DELTA_BUDGET", "10\tG", ""},
    {"DELTA_BUDGET", "10P", ""},
    {"DELTA_BUDGET", "1e9", ""},
    {"DELTA_BUDGET", "1.5G", ""},
    {"DELTA_BUDGET", "0x10", ""},
    {"DELTA_BUDGET", "NaN", ""},
    {"DELTA_BUDGET", "inf", ""},
    {"DELTA_BUDGET", "G", ""},
    {"DELTA_BUDGET", "6GiB\n", ""},
    {"DELTA_BUDGET", std::string("6G\0x", 4).substr(0, 2) + "x", ""},
    // Percentages.
    {"DELTA_BUDGET", "0%", ""},
    {"DELTA_BUDGET", "0.0%", ""},
    {"DELTA_BUDGET", "100.5%", ""},
    {"DELTA_BUDGET", "150%", ""},
    {"DELTA_BUDGET", "-5%", ""},
    {"DELTA_BUDGET", "%", ""},
    {"DELTA_BUDGET", "50%%", ""},
    {"DELTA_BUDGET", ".5%", ""},
    {"DELTA_BUDGET", "5.%", ""},
    {"DELTA_BUDGET", "1e1%", ""},
    {"DELTA_BUDGET", "nan%", ""},
    {"DELTA_BUDGET", "inf%", ""},
    {"DELTA_BUDGET", "50 % ", ""},
    {"DELTA_BUDGET", "50GiB%", ""},
    // Policies.
    {"DELTA_POLICY", "", ""},
    {"DELTA_POLICY", "Delta", ""},
    {"DELTA_POLICY", "lru ", ""},
    {"DELTA_POLICY", "fifo", ""},
    {"DELTA_POLICY", "belady", "needs the future and runs only in the replay simulator"},
    // Booleans.
    {"DELTA_TRACE_STACKS", "", ""},
    {"DELTA_TRACE_STACKS", "2", ""},
    {"DELTA_TRACE_STACKS", "-1", ""},
    {"DELTA_TRACE_STACKS", "y", ""},
    {"DELTA_TRACE_OVERWRITE", "enabled", ""},
    {"DELTA_TRACE_OVERWRITE", " 1", ""},
    {"DELTA_DISABLE", "", ""},
    {"DELTA_DISABLE", "01", ""},
    {"DELTA_STRICT", "truee", ""},
    {"DELTA_PREFETCH", "1.0", ""},
    {"DELTA_PLAN", "2", ""},
    // Host limit.
    {"DELTA_HOST_LIMIT", "", ""},
    {"DELTA_HOST_LIMIT", "-16GiB", ""},
    {"DELTA_HOST_LIMIT", "0", "a zero host limit leaves nowhere to page buffers to"},
    {"DELTA_HOST_LIMIT", "101%", ""},
    {"DELTA_HOST_LIMIT", "16 gigs", ""},
    // Minimum size: a size only.
    {"DELTA_MIN_BYTES", "", ""},
    {"DELTA_MIN_BYTES", "10%", ""},
    {"DELTA_MIN_BYTES", "-1", ""},
    {"DELTA_MIN_BYTES", "1 MiB MiB", ""},
    {"DELTA_MIN_BYTES", "99999999999999999999", ""},
    // Verbosity.
    {"DELTA_VERBOSE", "", ""},
    {"DELTA_VERBOSE", "3", ""},
    {"DELTA_VERBOSE", "-1", ""},
    {"DELTA_VERBOSE", "01", ""},
    {"DELTA_VERBOSE", "yes", ""},
    // Mode.
    {"DELTA_MODE", "", ""},
    {"DELTA_MODE", "VMM", ""},
    {"DELTA_MODE", "um", ""},
};

TEST(OptionsParse, InvalidValuesGiveOneLine) {
  for (const InvalidCase& c : kInvalid) {
    const OptionInfo* info = findInfo(c.name);
    ASSERT_NE(info, nullptr) << c.name;
    Parsed p = parse({std::string(c.name) + "=" + c.value});
    ASSERT_FALSE(p.ok) << c.name << "='" << c.value << "' was accepted";
    SCOPED_TRACE(p.error);
    EXPECT_EQ(p.error.find('\n'), std::string::npos);
    // Names the variable and the value (as typed, control bytes escaped).
    bool printable = true;
    for (char ch : c.value) printable = printable && static_cast<unsigned char>(ch) >= 0x20;
    if (printable) {
      EXPECT_EQ(p.error.rfind("libdelta: " + std::string(c.name) + "='" + c.value + "' is not valid: ",
                              0),
                0u);
    }
    // Says what is accepted, at the end.
    std::string expected = "expected " + expanded(info->accepted);
    ASSERT_GE(p.error.size(), expected.size());
    EXPECT_EQ(p.error.substr(p.error.size() - expected.size()), expected);
    if (*c.why) {
      EXPECT_NE(p.error.find(c.why), std::string::npos);
    }
  }
}

TEST(OptionsParse, TheIssuesExampleMessage) {
  Parsed p = parse({"DELTA_BUDGET=12 parsecs"});
  ASSERT_FALSE(p.ok);
  EXPECT_EQ(p.error,
            "libdelta: DELTA_BUDGET='12 parsecs' is not valid: expected a size such as 6GiB or a "
            "percentage of device memory such as 50%");
  p = parse({"DELTA_POLICY=belady"});
  ASSERT_FALSE(p.ok);
  EXPECT_EQ(p.error,
            "libdelta: DELTA_POLICY='belady' is not valid: policy 'belady' needs the future and "
            "runs only in the replay simulator (delta-trace); expected one of delta, lru, dtr, "
            "swap-only, recompute-only");
}

TEST(OptionsParse, ValuesAreEscapedAndCut) {
  Parsed p = parse({"DELTA_BUDGET=6\nGiB\x1b"});
  ASSERT_FALSE(p.ok);
  EXPECT_NE(p.error.find("DELTA_BUDGET='6\\x0aGiB\\x1b'"), std::string::npos) << p.error;
  p = parse({"DELTA_MODE=" + std::string(10000, 'x')});
  ASSERT_FALSE(p.ok);
  EXPECT_LT(p.error.size(), 300u);
  EXPECT_NE(p.error.find(std::string(80, 'x') + "...'"), std::string::npos) << p.error;
}

TEST(OptionsParse, OptionsUnchangedOnError) {
  Parsed good = parse({"DELTA_BUDGET=6GiB", "DELTA_POLICY=lru"});
  ASSERT_TRUE(good.ok);
  Options o = good.options;
  std::string error;
  Env bad({"DELTA_POLICY=dtr", "DELTA_BUDGET=lots"});
  EXPECT_FALSE(parseOptions(bad.get(), o, error));
  EXPECT_EQ(describeOptions(o), describeOptions(good.options));
}

TEST(OptionsParse, FirstOccurrenceWinsAndOthersAreIgnored) {
  Parsed p = parse({"PATH=/bin", "DELTA_POLICY=lru", "DELTA_POLICY=nonsense", "DELTA_NOEQUALS",
                    "delta_budget=lots", "XDELTA_BUDGET=lots", "=", ""});
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_EQ(p.options.policy, "lru");
}

TEST(OptionsParse, FirstErrorInTableOrder) {
  Parsed p = parse({"DELTA_MODE=x", "DELTA_BUDGET=y"});
  ASSERT_FALSE(p.ok);
  EXPECT_EQ(p.error.rfind("libdelta: DELTA_BUDGET='y'", 0), 0u) << p.error;
}

// --- Unknown variables. ---

struct UnknownCase {
  const char* entry;
  const char* error;
};

const UnknownCase kUnknown[] = {
    {"DELTA_BUGDET=6GiB",
     "libdelta: DELTA_BUGDET='6GiB' is not a DELTA option: did you mean DELTA_BUDGET?"},
    {"DELTA_BUDGE=6GiB",
     "libdelta: DELTA_BUDGE='6GiB' is not a DELTA option: did you mean DELTA_BUDGET?"},
    {"DELTA_budget=6GiB",
     "libdelta: DELTA_budget='6GiB' is not a DELTA option: did you mean DELTA_BUDGET?"},
    {"DELTA_POLICYS=lru",
     "libdelta: DELTA_POLICYS='lru' is not a DELTA option: did you mean DELTA_POLICY?"},
    {"DELTA_HOSTLIMIT=1G",
     "libdelta: DELTA_HOSTLIMIT='1G' is not a DELTA option: did you mean DELTA_HOST_LIMIT?"},
    {"DELTA_PREFECH=1",
     "libdelta: DELTA_PREFECH='1' is not a DELTA option: did you mean DELTA_PREFETCH?"},
    {"DELTA_TRACE_STACK=1",
     "libdelta: DELTA_TRACE_STACK='1' is not a DELTA option: did you mean DELTA_TRACE_STACKS?"},
    {"DELTA_MIN_BYTE=1",
     "libdelta: DELTA_MIN_BYTE='1' is not a DELTA option: did you mean DELTA_MIN_BYTES?"},
    {"DELTA_VERBOSITY=1",  // distance 3 from DELTA_VERBOSE: no guess
     "libdelta: DELTA_VERBOSITY='1' is not a DELTA option: expected one of DELTA_BUDGET, "
     "DELTA_POLICY, DELTA_TRACE, DELTA_TRACE_STACKS, DELTA_TRACE_OVERWRITE, DELTA_HOST_LIMIT, "
     "DELTA_MIN_BYTES, DELTA_VERBOSE, DELTA_DISABLE, DELTA_STRICT, DELTA_CUPTI_PATH, "
     "DELTA_MODE, DELTA_PREFETCH, DELTA_PLAN"},
    {"DELTA_=", nullptr},
    {"DELTA_X\n=\n", nullptr},
};

TEST(OptionsUnknown, NamedWithSuggestion) {
  for (const UnknownCase& c : kUnknown) {
    Parsed p = parse({"DELTA_POLICY=lru", c.entry});
    ASSERT_FALSE(p.ok) << c.entry;
    EXPECT_EQ(p.error.find('\n'), std::string::npos) << p.error;
    EXPECT_NE(p.error.find("is not a DELTA option"), std::string::npos) << p.error;
    if (c.error != nullptr) {
      EXPECT_EQ(p.error, c.error);
    }
  }
}

// A misspelt name is reported before another variable's bad value: its value was meant for a
// known option.
TEST(OptionsUnknown, ReportedBeforeBadValues) {
  Parsed p = parse({"DELTA_BUDGET=lots", "DELTA_PLOICY=lru"});
  ASSERT_FALSE(p.ok);
  EXPECT_EQ(p.error.rfind("libdelta: DELTA_PLOICY='lru' is not a DELTA option", 0), 0u) << p.error;
}

TEST(OptionsUnknown, EditDistance) {
  EXPECT_EQ(editDistance("", ""), 0u);
  EXPECT_EQ(editDistance("abc", ""), 3u);
  EXPECT_EQ(editDistance("DELTA_BUDGET", "delta_budget"), 0u);
  EXPECT_EQ(editDistance("DELTA_BUGDET", "DELTA_BUDGET"), 2u);
  EXPECT_EQ(editDistance("kitten", "sitting"), 3u);
}

// --- The off switch. ---

TEST(OptionsDisable, ShortCircuitsEverythingElse) {
  Parsed p = parse({"DELTA_BUDGET=lots", "DELTA_FUTURE_OPTION=1", "DELTA_DISABLE=1"});
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_TRUE(p.options.disabled);
  EXPECT_TRUE(p.options.budget.isPercent);  // the default, not "lots"
  EXPECT_EQ(p.options.policy, "delta");
}

TEST(OptionsDisable, MalformedOrOffStillChecks) {
  Parsed p = parse({"DELTA_DISABLE=please"});
  ASSERT_FALSE(p.ok);
  EXPECT_EQ(p.error.rfind("libdelta: DELTA_DISABLE='please' is not valid", 0), 0u) << p.error;
  p = parse({"DELTA_DISABLE=0", "DELTA_BUDGET=lots"});
  EXPECT_FALSE(p.ok);
}

// --- The value parsers directly. ---

TEST(OptionsValues, ParseSize) {
  struct Case {
    const char* text;
    bool ok;
    uint64_t bytes;
  };
  const Case cases[] = {
      {"0", true, 0},
      {"1", true, 1},
      {"1b", true, 1},
      {"1 B", true, 1},
      {"1k", true, kKiB},
      {"1K", true, kKiB},
      {"1KB", true, kKiB},
      {"1kib", true, kKiB},
      {"1KiB", true, kKiB},
      {"3M", true, 3 * kMiB},
      {"3 MB", true, 3 * kMiB},
      {"3MiB", true, 3 * kMiB},
      {"80G", true, 80 * kGiB},
      {"80gB", true, 80 * kGiB},
      {"80 GiB", true, 80 * kGiB},
      {"2T", true, 2 * kTiB},
      {"2TB", true, 2 * kTiB},
      {"2TiB", true, 2 * kTiB},
      {"8388607T", true, 8388607 * kTiB},
      {"9223372036854775807", true, 9223372036854775807ull},
      {"00000000000000000000000001", true, 1},
      {"9223372036854775808", false, 0},
      {"8388608T", false, 0},
      {"", false, 0},
      {" ", false, 0},
      {"K", false, 0},
      {"-1", false, 0},
      {"1 ", false, 0},
      {"1  K", false, 0},
      {"1 K ", false, 0},
      {"1KK", false, 0},
      {"1iB", false, 0},
      {"1bb", false, 0},
      {"1Kib ", false, 0},
      {"1.0", false, 0},
      {"1,000", false, 0},
      {"1_000", false, 0},
      {"1e3", false, 0},
      {"1%", false, 0},
  };
  for (const Case& c : cases) {
    uint64_t bytes = 12345;
    EXPECT_EQ(parseSize(c.text, bytes), c.ok) << "'" << c.text << "'";
    if (c.ok) {
      EXPECT_EQ(bytes, c.bytes) << c.text;
    }
  }
}

TEST(OptionsValues, ParsePercent) {
  struct Case {
    const char* text;
    bool ok;
    double percent;
  };
  const Case cases[] = {
      {"50%", true, 50},   {"12.5%", true, 12.5}, {"100%", true, 100}, {"100.0%", true, 100},
      {"0.001%", true, 0.001}, {"1 %", true, 1}, {"0%", false, 0},    {"100.01%", false, 0},
      {"50", false, 0},    {"%", false, 0},       {" 50%", false, 0}, {"50  %", false, 0},
      {"-1%", false, 0},   {"+1%", false, 0},     {"1e1%", false, 0}, {"0x10%", false, 0},
      {"NaN%", false, 0},  {"INF%", false, 0},    {"1.%", false, 0},  {".1%", false, 0},
      {"1..1%", false, 0}, {"50,5%", false, 0},
  };
  for (const Case& c : cases) {
    double percent = -1;
    EXPECT_EQ(parsePercent(c.text, percent), c.ok) << "'" << c.text << "'";
    if (c.ok) {
      EXPECT_EQ(percent, c.percent) << c.text;
    }
  }
}

TEST(OptionsValues, ParseBool) {
  for (const char* t : {"1", "true", "TRUE", "True", "yes", "YES", "on", "On"}) {
    bool v = false;
    EXPECT_TRUE(parseBool(t, v)) << t;
    EXPECT_TRUE(v) << t;
  }
  for (const char* f : {"0", "false", "False", "no", "NO", "off", "OFF"}) {
    bool v = true;
    EXPECT_TRUE(parseBool(f, v)) << f;
    EXPECT_FALSE(v) << f;
  }
  for (const char* bad : {"", "2", "t", "f", "y", "n", "enable", "disabled", " 1", "1 ", "00"}) {
    bool v = false;
    EXPECT_FALSE(parseBool(bad, v)) << "'" << bad << "'";
  }
}

TEST(OptionsValues, Formatting) {
  EXPECT_EQ(formatSize(0), "0");
  EXPECT_EQ(formatSize(1000), "1000");
  EXPECT_EQ(formatSize(kKiB), "1KiB");
  EXPECT_EQ(formatSize(1536 * kMiB), "1536MiB");
  EXPECT_EQ(formatSize(80 * kGiB), "80GiB");
  EXPECT_EQ(formatSize(3 * kTiB), "3TiB");
  EXPECT_EQ(formatPercent(90), "90%");
  EXPECT_EQ(formatPercent(12.5), "12.5%");
  EXPECT_EQ(formatPercent(0.1), "0.1%");
  EXPECT_EQ(formatMemory(80 * kGiB), "80.0 GiB");
  EXPECT_EQ(formatMemory(80 * kGiB + kGiB / 2), "80.5 GiB");
  EXPECT_EQ(formatMemory(kGiB - 1), "1024.0 MiB");
  EXPECT_EQ(formatMemory(512 * kMiB), "512.0 MiB");
  EXPECT_EQ(formatMemory(1500), "1.5 KiB");
  EXPECT_EQ(formatMemory(100), "100 bytes");
  EXPECT_EQ(formatMemory(~uint64_t{0}), "17179869184.0 GiB");
}

// Sizes and percentages print so that they read back to the same value.
TEST(OptionsValues, FormatReadsBack) {
  for (uint64_t bytes : {uint64_t{0}, uint64_t{1}, uint64_t{1000}, kKiB, 3 * kMiB + 1,
                         141 * kGiB, (uint64_t{1} << 63) - 1, (uint64_t{1} << 63) - kTiB}) {
    uint64_t back = 0;
    ASSERT_TRUE(parseSize(formatSize(bytes), back)) << bytes;
    EXPECT_EQ(back, bytes);
  }
  for (double percent : {0.001, 1.0, 12.5, 33.333, 90.0, 99.99, 100.0}) {
    double back = 0;
    ASSERT_TRUE(parsePercent(formatPercent(percent), back)) << percent;
    EXPECT_EQ(back, percent);
  }
}

// --- Second stage. ---

struct ResolveCase {
  const char* budget;
  const char* hostLimit;
  uint64_t device;
  uint64_t host;
  bool ok;
  uint64_t budgetBytes;
  uint64_t hostLimitBytes;
  const char* error;  // the whole line, when !ok
};

const ResolveCase kResolve[] = {
    {"90%", "50%", 80 * kGiB, 512 * kGiB, true, 77309411328ull, 256 * kGiB, ""},
    {"100%", "100%", 80 * kGiB, 512 * kGiB, true, 80 * kGiB, 512 * kGiB, ""},
    {"12.5%", "25%", 80 * kGiB, 1000, true, 10 * kGiB, 250, ""},
    {"6GiB", "16GiB", 80 * kGiB, 512 * kGiB, true, 6 * kGiB, 16 * kGiB, ""},
    {"80GiB", "16GiB", 80 * kGiB, 0, true, 80 * kGiB, 16 * kGiB, ""},  // host unknown: as set
    {"50%", "50%", 3, 3, true, 1, 1, ""},                                // floor
    {"200GiB", "50%", 80 * kGiB, 512 * kGiB, false, 0, 0,
     "libdelta: DELTA_BUDGET='200GiB' is more than the device's 80.0 GiB of memory"},
    {"80GiB", "50%", 80 * kGiB - 1, 512 * kGiB, false, 0, 0,
     "libdelta: DELTA_BUDGET='80GiB' is more than the device's 80.0 GiB of memory"},
    {"1GiB", "50%", 512 * kMiB, 512 * kGiB, false, 0, 0,
     "libdelta: DELTA_BUDGET='1GiB' is more than the device's 512.0 MiB of memory"},
    {"0.001%", "50%", 1000, 512 * kGiB, false, 0, 0,
     "libdelta: DELTA_BUDGET='0.001%' is 0 bytes of the device's 1000 bytes of memory; "
     "expected a larger percentage"},
    {"6GiB", "1TiB", 80 * kGiB, 512 * kGiB, false, 0, 0,
     "libdelta: DELTA_HOST_LIMIT='1TiB' is more than the host's 512.0 GiB of memory"},
    {"6GiB", "50%", 80 * kGiB, 0, false, 0, 0,
     "libdelta: DELTA_HOST_LIMIT='50%' cannot be resolved: the host's memory size is unknown; "
     "set a size such as 16GiB instead"},
    {"6GiB", "16GiB", 0, 512 * kGiB, false, 0, 0,
     "libdelta: DELTA_BUDGET cannot be checked: the device's memory size is unknown (0 bytes "
     "reported)"},
};

TEST(OptionsResolve, Bounds) {
  for (const ResolveCase& c : kResolve) {
    Parsed p = parse({std::string("DELTA_BUDGET=") + c.budget,
                      std::string("DELTA_HOST_LIMIT=") + c.hostLimit});
    ASSERT_TRUE(p.ok) << p.error;
    uint64_t budget = 7;
    uint64_t hostLimit = 7;
    std::string error;
    bool ok = resolveOptions(p.options, c.device, c.host, budget, hostLimit, error);
    EXPECT_EQ(ok, c.ok) << c.budget << " " << c.hostLimit << ": " << error;
    if (c.ok) {
      EXPECT_EQ(budget, c.budgetBytes) << c.budget;
      EXPECT_EQ(hostLimit, c.hostLimitBytes) << c.hostLimit;
    } else {
      EXPECT_EQ(error, c.error);
      EXPECT_EQ(budget, 7u);  // untouched on error
      EXPECT_EQ(hostLimit, 7u);
    }
  }
}

TEST(OptionsResolve, PercentNeverExceedsTheTotal) {
  for (uint64_t total : {uint64_t{1}, uint64_t{3}, 141 * kGiB, ~uint64_t{0}, ~uint64_t{0} - 1}) {
    Options o;
    o.budget = {0, 100.0, true};
    o.hostLimit = {0, 99.999, true};
    uint64_t budget = 0;
    uint64_t hostLimit = 0;
    std::string error;
    ASSERT_TRUE(resolveOptions(o, total, ~uint64_t{0}, budget, hostLimit, error)) << error;
    EXPECT_EQ(budget, total);
    EXPECT_LT(hostLimit, ~uint64_t{0});
  }
}

// --- DELTA_VERBOSE's listing. ---

TEST(OptionsDescribe, DefaultsAndChanges) {
  Parsed p = parse({"DELTA_BUDGET=6GiB", "DELTA_MIN_BYTES=1048576", "DELTA_TRACE=/t/%p"});
  ASSERT_TRUE(p.ok) << p.error;
  std::string text = describeOptions(p.options);
  EXPECT_EQ(text,
            "libdelta: DELTA_BUDGET=6GiB (default: 90%)\n"
            "libdelta: DELTA_POLICY=delta (default)\n"
            "libdelta: DELTA_TRACE=/t/%p (default: '')\n"
            "libdelta: DELTA_TRACE_STACKS=0 (default)\n"
            "libdelta: DELTA_TRACE_OVERWRITE=0 (default)\n"
            "libdelta: DELTA_HOST_LIMIT=50% (default)\n"
            "libdelta: DELTA_MIN_BYTES=1MiB (default)\n"
            "libdelta: DELTA_VERBOSE=0 (default)\n"
            "libdelta: DELTA_DISABLE=0 (default)\n"
            "libdelta: DELTA_STRICT=0 (default)\n"
            "libdelta: DELTA_CUPTI_PATH='' (default)\n"
            "libdelta: DELTA_MODE=vmm (default)\n"
            "libdelta: DELTA_PREFETCH=1 (default)\n"
            "libdelta: DELTA_PLAN=0 (default)\n");
}

TEST(OptionsDescribe, OneLinePerOptionWhateverThePaths) {
  Parsed p = parse({"DELTA_TRACE=a\nb\\c", "DELTA_CUPTI_PATH=\r"});
  ASSERT_TRUE(p.ok) << p.error;
  std::string text = describeOptions(p.options);
  std::size_t lines = 0;
  for (char c : text) lines += c == '\n';
  EXPECT_EQ(lines, optionCount());
  EXPECT_NE(text.find("DELTA_TRACE=a\\x0ab\\x5cc (default: '')"), std::string::npos) << text;
}

// --- The Markdown table and the files that carry it. ---

TEST(OptionsMarkdown, OneRowPerOption) {
  std::string table = optionsMarkdownTable();
  EXPECT_EQ(table.rfind("| variable | default | meaning |\n|---|---|---|\n", 0), 0u);
  std::size_t rows = 0;
  for (char c : table) rows += c == '\n';
  EXPECT_EQ(rows, optionCount() + 2);
  EXPECT_EQ(table.find("{policies}"), std::string::npos);
  EXPECT_NE(table.find("| `DELTA_BUDGET` | `90%` | "), std::string::npos);
  EXPECT_NE(table.find("| `DELTA_TRACE` | empty | "), std::string::npos);
  EXPECT_NE(table.find(onlinePolicyNames()), std::string::npos);
  for (std::size_t i = 0; i < optionCount(); ++i) {
    const OptionInfo& info = optionInfo(i);
    // A '|' or a newline in a cell would break the table.
    for (std::string_view cell : {info.name, info.defaultValue, info.meaning}) {
      EXPECT_EQ(cell.find('|'), std::string_view::npos) << info.name;
      EXPECT_EQ(cell.find('\n'), std::string_view::npos) << info.name;
    }
  }
}

TEST(OptionsMarkdown, DocsOptionsMdIsUpToDate) {
  std::string path = std::string(DELTA_SOURCE_ROOT) + "/docs/options.md";
  auto text = doc::readFile(path);
  ASSERT_TRUE(text.has_value()) << "cannot read " << path;
  auto table = doc::markedTable(*text);
  ASSERT_TRUE(table.has_value()) << path << " lacks the marker lines";
  EXPECT_EQ(*table, optionsMarkdownTable())
      << path << " is out of date; regenerate it with: delta-options --update " << path;
}

TEST(OptionsMarkdown, ReadmeTableIsUpToDate) {
  std::string path = std::string(DELTA_SOURCE_ROOT) + "/README.md";
  auto text = doc::readFile(path);
  if (!text) GTEST_SKIP() << "no " << path;
  auto table = doc::markedTable(*text);
  if (!table) GTEST_SKIP() << path << " has no options-table markers yet";
  EXPECT_EQ(*table, optionsMarkdownTable())
      << path << " is out of date; regenerate it with: delta-options --update " << path;
}

TEST(OptionsMarkdown, MarkedRegionHelpers) {
  std::string text = "intro\n<!-- options-table-begin -->\n\nold\n\n<!-- options-table-end -->\nend\n";
  EXPECT_EQ(doc::markedTable(text), "old\n");
  EXPECT_EQ(doc::withTable(text, "new\n"),
            "intro\n<!-- options-table-begin -->\nnew\n<!-- options-table-end -->\nend\n");
  EXPECT_FALSE(doc::markedTable("no markers\n").has_value());
  EXPECT_FALSE(doc::markedTable("<!-- options-table-end -->\n<!-- options-table-begin -->\n"));
}

// --- Host memory. ---

TEST(OptionsHost, ReadsMemTotal) {
  char path[] = "/tmp/delta-meminfo-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  auto write = [&](const char* text) {
    ASSERT_EQ(ftruncate(fd, 0), 0);
    ASSERT_EQ(pwrite(fd, text, std::char_traits<char>::length(text), 0),
              static_cast<ssize_t>(std::char_traits<char>::length(text)));
  };
  write("MemTotal:       263845812 kB\nMemFree:        1 kB\n");
  EXPECT_EQ(readHostMemoryBytes(path), 263845812ull * 1024);
  write("MemFree:        1 kB\nMemTotal: 1024 kB\n");
  EXPECT_EQ(readHostMemoryBytes(path), 1024ull * 1024);
  write("MemTotal:       lots kB\n");
  EXPECT_EQ(readHostMemoryBytes(path), 0u);
  write("MemTotal: 5 MB\n");
  EXPECT_EQ(readHostMemoryBytes(path), 0u);
  write("");
  EXPECT_EQ(readHostMemoryBytes(path), 0u);
  close(fd);
  unlink(path);
  EXPECT_EQ(readHostMemoryBytes("/nonexistent/meminfo"), 0u);
  EXPECT_GT(readHostMemoryBytes(), 0u);  // Linux's own
}

}  // namespace
}  // namespace delta::shim
