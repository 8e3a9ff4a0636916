// A small, strict parser for one JSON object per line with flat values, as in DTR's op logs:
// strings, integers, and arrays of strings or of integers. Anything else (nesting, floats,
// true/false/null, trailing text) is an error with its column. Offline code.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace delta::policy {

struct JsonValue {
  enum class Kind : std::uint8_t { kString, kInt, kArray };
  Kind kind = Kind::kString;
  std::string str;
  std::int64_t num = 0;
  std::vector<std::string> strs;  // kArray of strings
  std::vector<std::int64_t> nums; // kArray of integers
};

class JsonLine {
 public:
  // Empty string on success, else what is wrong and where.
  std::string parse(std::string_view line);
  const JsonValue* find(std::string_view key) const;

 private:
  struct Field {
    std::string key;
    JsonValue value;
  };
  std::vector<Field> fields_;
};

}  // namespace delta::policy
