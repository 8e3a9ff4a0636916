// JSON documents from gzip or plain files: see json_document.h.
#include "tools/json_document.h"

#include <zlib.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <sys/stat.h>

namespace delta::tools {

namespace {

std::string readGz(const std::string& path, std::size_t limit, bool cut_at_limit, std::string& out) {
  out.clear();
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return path + ": cannot open: " + std::strerror(errno);
  if (S_ISDIR(st.st_mode)) return path + ": is a directory, not a trace file";
  // gzopen reads plain files as they are, so one path serves both.
  gzFile gz = gzopen(path.c_str(), "rb");
  if (gz == nullptr) return path + ": cannot open: " + std::strerror(errno != 0 ? errno : EIO);
  gzbuffer(gz, 1 << 17);
  std::string error;
  char buf[1 << 16];
  for (;;) {
    const int n = gzread(gz, buf, sizeof buf);
    if (n < 0) {
      int code = 0;
      const char* what = gzerror(gz, &code);
      error = path + ": cannot read (" + (what != nullptr ? what : "read error") +
              "): a corrupt or truncated gzip file?";
      break;
    }
    if (n == 0) break;
    const std::size_t room = limit - out.size();
    out.append(buf, std::min<std::size_t>(static_cast<std::size_t>(n), room));
    if (static_cast<std::size_t>(n) > room || out.size() == limit) {
      if (!cut_at_limit) {
        error = path + ": larger than " + std::to_string(limit >> 20) +
                " MiB once decompressed; split the trace or record fewer iterations";
      }
      break;
    }
  }
  gzclose(gz);
  if (!error.empty()) out.clear();
  return error;
}

}  // namespace

std::string readTextFile(const std::string& path, std::size_t limit, std::string& out) {
  return readGz(path, limit, false, out);
}

std::string readTextPrefix(const std::string& path, std::size_t bytes, std::string& out) {
  return readGz(path, bytes, true, out);
}

std::string parseJson(const std::string& path, const std::string& text, nlohmann::json& out) {
  try {
    out = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    const bool at_end = e.byte >= text.size();
    return path + ": not valid JSON at byte " + std::to_string(e.byte) +
           (at_end ? " (the file ends early: truncated?)" : "") + "; re-record or re-export the trace";
  } catch (const std::exception& e) {
    return path + ": not valid JSON (" + e.what() + ")";
  }
  return {};
}

const nlohmann::json* member(const nlohmann::json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

bool asInt(const nlohmann::json& v, std::int64_t& out) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)) return false;
    out = v.get<std::int64_t>();
    return true;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e18) return false;
    out = static_cast<std::int64_t>(d);
    return true;
  }
  return false;
}

bool asNumber(const nlohmann::json& v, double& out) {
  if (!v.is_number()) return false;
  out = v.get<double>();
  return std::isfinite(out);
}

}  // namespace delta::tools
