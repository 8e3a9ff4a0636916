// Number and size arguments of the training workloads (train-mlp, train-mlp-cuda,
// train-cublas): plain C++17, so that nvcc compiles it too. Header only.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

namespace delta::workloads {

// A decimal integer, nothing else around it.
inline bool parse_u64(std::string_view text, uint64_t* out) {
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out, 10);
  return ec == std::errc() && end == text.data() + text.size();
}

// "1073741824", "512K", "256M", "1G", "1GiB", "2gb": binary multiples; 0 is not a size.
inline bool parse_size(std::string_view text, uint64_t* out) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  uint64_t value = 0;
  if (!parse_u64(text.substr(0, digits), &value) || value == 0) return false;
  std::string suffix(text.substr(digits));
  for (char& c : suffix) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  int shift = 0;
  if (!suffix.empty() && suffix != "b") {
    const size_t unit = std::string_view("kmgt").find(suffix[0]);
    const std::string_view rest = std::string_view(suffix).substr(1);
    if (unit == std::string_view::npos || !(rest.empty() || rest == "b" || rest == "ib")) return false;
    shift = 10 * static_cast<int>(unit + 1);
  }
  if (value > (UINT64_MAX >> shift)) return false;
  *out = value << shift;
  return true;
}

}  // namespace delta::workloads
