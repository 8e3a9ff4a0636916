// Reads a text file line by line, gzip-compressed or plain (decided by content, not by name).
// Uses zlib when the build found it, else `gzip -dc` through a pipe for compressed files.
#pragma once

#include <string>

namespace delta::policy {

class LineReader {
 public:
  LineReader() = default;
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // Empty string on success, else why the file cannot be read.
  std::string open(const std::string& path);
  // Next line without its '\n'; false at the end (or on a read error, or a line longer than
  // 16 MiB: see error()).
  bool next(std::string& line);
  const std::string& error() const { return error_; }

 private:
  void close();

  void* gz_ = nullptr;     // gzFile, when built with zlib
  void* file_ = nullptr;   // FILE*
  bool pipe_ = false;      // file_ came from popen
  std::string path_;
  std::string error_;
};

}  // namespace delta::policy
