#include "tools/export_file.h"

#include <fmt/core.h>
#include <sys/stat.h>

namespace delta::tools {

std::string stagingPathFor(const std::string& output) {
  struct stat st {};
  if (stat(output.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) return {};
  return output + ".partial";
}

ExportFile::ExportFile(const std::string& output, bool binary)
    : output_(output), partial_(stagingPathFor(output)), toFile_(output != "-") {
  const std::string& target = partial_.empty() ? output_ : partial_;
  out_ = toFile_ ? std::fopen(target.c_str(), binary ? "wb" : "w") : stdout;
  if (out_ == nullptr) fmt::print(stderr, "delta-trace export: cannot write {}\n", output_);
}

int ExportFile::finish(const trace::TraceReader& reader) {
  bool writeFailed = std::ferror(out_) != 0;
  if (toFile_) writeFailed = std::fclose(out_) != 0 || writeFailed;
  out_ = nullptr;
  const bool corrupt = reader.status() != trace::ReadStatus::kEnd &&
                       reader.status() != trace::ReadStatus::kTruncated;
  if (toFile_ && !partial_.empty() &&
      (writeFailed || corrupt || std::rename(partial_.c_str(), output_.c_str()) != 0)) {
    std::remove(partial_.c_str());
    if (!corrupt) writeFailed = true;
  }
  if (writeFailed) {
    fmt::print(stderr, "delta-trace export: writing {} failed\n", output_);
    return 1;
  }
  if (reader.status() != trace::ReadStatus::kEnd) {
    const bool cut = reader.status() == trace::ReadStatus::kTruncated;
    fmt::print(stderr, "delta-trace export: {}: {}{}\n", cut ? "warning" : "error", reader.error(),
               cut ? "; exported the records before it" : "");
    return cut ? 0 : 1;
  }
  return 0;
}

}  // namespace delta::tools
