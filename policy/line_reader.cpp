// Plain or gzip line reader: see line_reader.h.
#include "policy/line_reader.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#if DELTA_HAVE_ZLIB
#include <zlib.h>
#endif

namespace delta::policy {
namespace {

// Far longer than any op-log line; a "line" longer than this is not text (a binary file, or
// /dev/zero, which would otherwise be read until memory runs out).
constexpr std::size_t kMaxLineBytes = 16u << 20;

}  // namespace

LineReader::~LineReader() { close(); }

void LineReader::close() {
#if DELTA_HAVE_ZLIB
  if (gz_ != nullptr) gzclose(static_cast<gzFile>(gz_));
#endif
  gz_ = nullptr;
  if (file_ != nullptr) {
    if (pipe_) {
      const int status = pclose(static_cast<FILE*>(file_));
      if (status != 0 && error_.empty()) error_ = path_ + ": not a valid gzip file";
    } else {
      std::fclose(static_cast<FILE*>(file_));
    }
  }
  file_ = nullptr;
  pipe_ = false;
}

std::string LineReader::open(const std::string& path) {
  close();
  path_ = path;
  error_.clear();
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return path + ": " + std::strerror(errno);
  unsigned char magic[2] = {0, 0};
  const std::size_t got = std::fread(magic, 1, 2, f);
  const bool gzip = got == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  std::fclose(f);
#if DELTA_HAVE_ZLIB
  (void)gzip;
  gzFile gz = gzopen(path.c_str(), "rb");  // reads plain files as they are
  if (gz == nullptr) return path + ": cannot open";
  gzbuffer(gz, 1 << 16);
  gz_ = gz;
#else
  if (gzip) {
    std::string quoted = "'";
    for (char c : path) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    quoted += "'";
    file_ = popen(("gzip -dc -- " + quoted + " 2>/dev/null").c_str(), "r");
    pipe_ = true;
  } else {
    file_ = std::fopen(path.c_str(), "rb");
  }
  if (file_ == nullptr) return path + ": cannot open";
#endif
  return {};
}

bool LineReader::next(std::string& line) {
  line.clear();
  char buf[1 << 14];
  // Counted in reads, not in line.size(): a NUL byte ends what `line += buf` appends, so a
  // binary file's "line" may never grow while it is read for ever.
  std::size_t pieces = 0;
  for (;;) {
    const char* got = nullptr;
#if DELTA_HAVE_ZLIB
    if (gz_ != nullptr) {
      got = gzgets(static_cast<gzFile>(gz_), buf, sizeof buf);
      if (got == nullptr) {
        int code = Z_OK;
        const char* msg = gzerror(static_cast<gzFile>(gz_), &code);
        if (code != Z_OK && code != Z_STREAM_END) error_ = path_ + ": " + msg;
      }
    }
#endif
    if (file_ != nullptr) got = std::fgets(buf, sizeof buf, static_cast<FILE*>(file_));
    if (got == nullptr) {
      if (file_ != nullptr && pipe_ && line.empty()) close();  // surfaces gzip's exit status
      return !line.empty();
    }
    line += buf;
    if (!line.empty() && line.back() == '\n') {
      line.pop_back();
      return true;
    }
    if (++pieces * (sizeof buf - 1) > kMaxLineBytes) {
      error_ = path_ + ": a line longer than 16 MiB: not a text file";
      line.clear();
      return false;
    }
  }
}

}  // namespace delta::policy
