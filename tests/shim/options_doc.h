// The marked options table in a Markdown file (docs/options.md, README.md): find it, replace
// it. Shared by options-test (which checks the files) and delta-options (which rewrites them).
#pragma once

#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include "shim/options.h"

namespace delta::shim::doc {

inline std::optional<std::string> readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Where the table lives: from just after the begin marker's line to the start of the end
// marker's line. Nothing when either marker is missing or they are out of order.
struct Region {
  std::size_t begin = 0;
  std::size_t end = 0;
};

inline std::optional<Region> findRegion(std::string_view text) {
  std::size_t open = text.find(kTableBeginMarker);
  if (open == std::string_view::npos) return std::nullopt;
  std::size_t afterOpen = text.find('\n', open);
  if (afterOpen == std::string_view::npos) return std::nullopt;
  std::size_t close = text.find(kTableEndMarker, afterOpen);
  if (close == std::string_view::npos) return std::nullopt;
  std::size_t lineStart = text.rfind('\n', close);
  return Region{afterOpen + 1, lineStart + 1};
}

// The marked table with blank lines around it trimmed (Markdown renderers like one before a
// table; the check should not care).
inline std::optional<std::string> markedTable(std::string_view text) {
  auto region = findRegion(text);
  if (!region) return std::nullopt;
  std::string_view table = text.substr(region->begin, region->end - region->begin);
  while (!table.empty() && table.front() == '\n') table.remove_prefix(1);
  while (table.size() >= 2 && table.substr(table.size() - 2) == "\n\n") table.remove_suffix(1);
  return std::string(table);
}

// `text` with the marked table replaced by `table`; nothing when there are no markers.
inline std::optional<std::string> withTable(std::string_view text, std::string_view table) {
  auto region = findRegion(text);
  if (!region) return std::nullopt;
  std::string out(text.substr(0, region->begin));
  out += table;
  out += text.substr(region->end);
  return out;
}

}  // namespace delta::shim::doc
