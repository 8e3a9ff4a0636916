// Command-line parsing shared by delta-trace's subcommands: `--name value`, `--name=value` and
// flags, checked against the options a subcommand declares; sizes, percentages and lists.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace delta::tools {

struct OptionSpec {
  std::string_view name;  // without "--"
  bool takes_value;
};

class CliArgs {
 public:
  // Empty string on success, else a one-line error.
  std::string parse(const std::vector<std::string>& args, const std::vector<OptionSpec>& specs);

  bool has(std::string_view name) const;
  std::optional<std::string> value(std::string_view name) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::vector<std::pair<std::string, std::string>> values_;
  std::vector<std::string> positional_;
};

// A budget: bytes ("123456", "512M", "4GiB", "6GB") or a share of a peak ("30%").
struct Budget {
  bool percent = false;
  double value = 0;  // bytes, or percent
  std::string text;
  std::uint64_t bytesFor(std::uint64_t peak) const;
};

std::optional<Budget> parseBudget(std::string_view text);
std::optional<double> parsePositive(std::string_view text);        // > 0, finite
std::optional<double> parsePercent(std::string_view text);         // "20%" or "20", >= 0
std::optional<std::uint32_t> parseCount(std::string_view text);    // integer >= 0
std::vector<std::string> splitList(std::string_view text);         // "a,b,c"

}  // namespace delta::tools
