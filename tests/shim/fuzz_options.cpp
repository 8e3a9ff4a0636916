// libFuzzer target for the options parser: the input is an environment (entries separated by
// NUL bytes). Checks the contract rather than values: errors are one "libdelta: " line, a
// parse never throws or crashes, and what describeOptions prints reads back the same.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "shim/options.h"

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

void checkLine(const std::string& error) {
  check(error.rfind("libdelta: ", 0) == 0);
  check(error.find('\n') == std::string::npos);
  check(error.size() < 2048);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace delta::shim;
  // Entries as environ holds them; each gets its own string so pointers stay valid.
  std::vector<std::string> entries;
  std::string current;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      entries.push_back(current);
      current.clear();
    } else {
      current += static_cast<char>(data[i]);
    }
  }
  entries.push_back(current);
  std::vector<char*> environment;
  for (std::string& e : entries) environment.push_back(e.data());
  environment.push_back(nullptr);

  Options options;
  std::string error;
  if (!parseOptions(environment.data(), options, error)) {
    checkLine(error);
    return 0;
  }
  // Each printed value is the canonical form: it must parse back to the same options.
  std::string described = describeOptions(options);
  std::vector<std::string> again;
  size_t at = 0;
  while (at < described.size()) {
    size_t end = described.find('\n', at);
    std::string line = described.substr(at, end - at);
    at = end + 1;
    line.erase(0, std::string("libdelta: ").size());
    line.erase(line.rfind(" (default"));
    size_t equals = line.find('=');
    if (line.compare(equals + 1, std::string::npos, "''") == 0) line.erase(equals + 1);
    again.push_back(line);
  }
  std::vector<char*> againEnvironment;
  for (std::string& e : again) againEnvironment.push_back(e.data());
  againEnvironment.push_back(nullptr);
  // Paths with control bytes or '\\' are printed escaped, so they do not read back as is.
  auto plain = [](const std::string& path) {
    for (char c : path) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == '\\') return false;
    }
    return true;
  };
  if (plain(options.tracePath) && plain(options.cuptiPath)) {
    Options reparsed;
    std::string againError;
    check(parseOptions(againEnvironment.data(), reparsed, againError));
    check(describeOptions(reparsed) == described);
  }

  for (uint64_t device : {uint64_t{1}, uint64_t{1} << 30, uint64_t{141} << 30, ~uint64_t{0}}) {
    for (uint64_t host : {uint64_t{0}, uint64_t{1} << 20, uint64_t{2} << 40}) {
      uint64_t budget = 0;
      uint64_t hostLimit = 0;
      if (resolveOptions(options, device, host, budget, hostLimit, error)) {
        check(budget > 0 && budget <= device);
        check(host == 0 || (hostLimit > 0 && hostLimit <= host));
      } else {
        checkLine(error);
      }
    }
  }
  return 0;
}
