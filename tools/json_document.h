// Whole JSON documents from files, gzip-compressed or plain (decided by content): PyTorch
// Execution Traces and Kineto traces. Parsed with nlohmann/json (Debian's nlohmann-json3-dev),
// a dependency of the tools only: the shim never parses JSON. Offline code.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>

namespace delta::tools {

// The file's text (decompressed), at most `limit` bytes; empty string on success, else a
// one-line reason that names the file.
std::string readTextFile(const std::string& path, std::size_t limit, std::string& out);
// The first bytes of the file's text (decompressed), for recognising its format.
std::string readTextPrefix(const std::string& path, std::size_t bytes, std::string& out);
// `text` parsed; on error a reason naming `path` and the byte where parsing stopped.
std::string parseJson(const std::string& path, const std::string& text, nlohmann::json& out);

// Checked accessors: null when absent or of another type.
const nlohmann::json* member(const nlohmann::json& object, const char* key);
// An integer that fits an int64 (JSON integers, or floats with no fraction written by tools).
bool asInt(const nlohmann::json& v, std::int64_t& out);
bool asNumber(const nlohmann::json& v, double& out);

}  // namespace delta::tools
