// Command-line parsing helpers: see cli_args.h.
#include "tools/cli_args.h"

#include <charconv>
#include <cmath>

namespace delta::tools {

std::string CliArgs::parse(const std::vector<std::string>& args, const std::vector<OptionSpec>& specs) {
  values_.clear();
  positional_.clear();
  bool only_positional = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (only_positional || a.size() < 2 || a.compare(0, 2, "--") != 0) {
      if (!only_positional && a.size() > 1 && a[0] == '-') return "unknown option '" + a + "'";
      positional_.push_back(a);
      continue;
    }
    if (a == "--") {
      only_positional = true;
      continue;
    }
    std::string name = a.substr(2);
    std::optional<std::string> inline_value;
    if (const auto eq = name.find('='); eq != std::string::npos) {
      inline_value = name.substr(eq + 1);
      name.resize(eq);
    }
    const OptionSpec* spec = nullptr;
    for (const OptionSpec& s : specs) {
      if (s.name == name) spec = &s;
    }
    if (spec == nullptr) return "unknown option '--" + name + "'";
    std::string value;
    if (spec->takes_value) {
      if (inline_value) {
        value = *inline_value;
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return "option '--" + name + "' needs a value";
      }
    } else if (inline_value) {
      return "option '--" + name + "' takes no value";
    }
    for (const auto& [n, v] : values_) {
      if (n == name) return "option '--" + name + "' given twice";
    }
    values_.emplace_back(name, value);
  }
  return {};
}

bool CliArgs::has(std::string_view name) const {
  for (const auto& [n, v] : values_) {
    if (n == name) return true;
  }
  return false;
}

std::optional<std::string> CliArgs::value(std::string_view name) const {
  for (const auto& [n, v] : values_) {
    if (n == name) return v;
  }
  return std::nullopt;
}

namespace {

std::optional<double> parseNumber(std::string_view text, std::string_view& rest) {
  double v = 0;
  const char* b = text.data();
  const char* e = b + text.size();
  auto [p, ec] = std::from_chars(b, e, v);
  if (ec != std::errc() || !std::isfinite(v)) return std::nullopt;
  rest = std::string_view(p, static_cast<std::size_t>(e - p));
  return v;
}

}  // namespace

std::uint64_t Budget::bytesFor(std::uint64_t peak) const {
  const double bytes = percent ? static_cast<double>(peak) * value / 100.0 : value;
  return static_cast<std::uint64_t>(std::llround(bytes));
}

std::optional<Budget> parseBudget(std::string_view text) {
  std::string_view rest;
  const std::optional<double> v = parseNumber(text, rest);
  if (!v || *v <= 0) return std::nullopt;
  Budget b;
  b.text = std::string(text);
  if (rest == "%") {
    b.percent = true;
    b.value = *v;
    return b;
  }
  struct Unit {
    std::string_view suffix;
    double scale;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},          {"B", 1},           {"K", 1024.0},     {"KiB", 1024.0},
      {"M", 1048576.0}, {"MiB", 1048576.0}, {"G", 1073741824.0}, {"GiB", 1073741824.0},
      {"KB", 1e3},      {"MB", 1e6},        {"GB", 1e9},       {"T", 1099511627776.0},
      {"TiB", 1099511627776.0}, {"TB", 1e12}};
  for (const Unit& u : kUnits) {
    if (rest == u.suffix) {
      b.value = *v * u.scale;
      if (b.value < 1) return std::nullopt;
      return b;
    }
  }
  return std::nullopt;
}

std::optional<double> parsePositive(std::string_view text) {
  std::string_view rest;
  const std::optional<double> v = parseNumber(text, rest);
  if (!v || !rest.empty() || *v <= 0) return std::nullopt;
  return v;
}

std::optional<double> parsePercent(std::string_view text) {
  std::string_view rest;
  const std::optional<double> v = parseNumber(text, rest);
  if (!v || (!rest.empty() && rest != "%") || *v < 0) return std::nullopt;
  return v;
}

std::optional<std::uint32_t> parseCount(std::string_view text) {
  std::uint32_t v = 0;
  const char* b = text.data();
  const char* e = b + text.size();
  auto [p, ec] = std::from_chars(b, e, v);
  if (ec != std::errc() || p != e || text.empty()) return std::nullopt;
  return v;
}

std::vector<std::string> splitList(std::string_view text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    const std::size_t end = comma == std::string_view::npos ? text.size() : comma;
    out.emplace_back(text.substr(start, end - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace delta::tools
