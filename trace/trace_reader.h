// TraceReader: streams a trace file (format.h) record by record through a fixed-size buffer, so a
// trace of any size reads in bounded memory (the largest chunk, at most 16 MiB, plus the name
// and stack tables). Validates the header and every chunk's checksum, resolves names and
// stacks, and says precisely what is wrong with a file that is foreign, newer, corrupt or cut
// short, with byte offsets. Never crashes on any input (trace/fuzz/ checks that). Offline code.
//
//   TraceReader r;
//   if (std::string err = r.open(path); !err.empty()) { ...print err... }
//   Record rec;
//   while (r.next(rec)) { switch (rec.type) { case RecordType::kLaunch: rec.launch ... } }
//   if (r.status() != ReadStatus::kEnd) { ...print r.error() (records so far were valid)... }
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "trace/format.h"

namespace delta::trace {

enum class ReadStatus : std::uint8_t {
  kOk,            // more records may follow
  kEnd,           // the whole file was read
  kTruncated,     // the file ends inside a chunk or record: everything before was delivered
  kCorrupt,       // bad chunk tag, checksum, length or record: everything before was delivered
  kForeign,       // not a DELTA trace
  kNewerVersion,  // a format version this reader does not know
  kIoError,
};

// One record as read. The union member that matches `type` is valid; string views and spans
// point into the reader and stay valid until the next call to next().
struct Record {
  Record() : alloc{} {}
  RecordType type = RecordType::kAlloc;
  std::uint64_t offset = 0;  // of the record's header in the file
  std::uint32_t size = 0;    // header + payload bytes
  std::uint32_t thread = 0;  // the chunk's thread number (0: the writer's own records)
  union {
    StringRecord string;
    StackRecord stack;
    AllocRecord alloc;
    FreeRecord free;
    LaunchRecord launch;
    CopyRecord copy;
    MemsetRecord memset;
    MovementRecord movement;  // kEvict, kRestore, kRecompute
    BudgetChangeRecord budget;
    OverBudgetRecord over_budget;
    IterationRecord iteration;
    CloseRecord close;
    PlanRecord plan;
  };
};

class TraceReader {
 public:
  TraceReader() = default;
  ~TraceReader();
  TraceReader(const TraceReader&) = delete;
  TraceReader& operator=(const TraceReader&) = delete;

  // Opens the file and reads its header. "" on success; else the error (also in error()).
  std::string open(const std::string& path);
  // The same over bytes in memory (tests, fuzzing); `bytes` must outlive the reader.
  std::string openMemory(std::string_view bytes, std::string name = "<memory>");

  const FileHeader& header() const { return header_; }
  // Next record; false at the end of the file or on an error (see status()).
  bool next(Record& r);
  ReadStatus status() const { return status_; }
  // "FILE: what is wrong at byte offset N" for any status but kOk/kEnd; else "".
  const std::string& error() const { return error_; }
  // The byte offset just past the last whole record delivered (or the header).
  std::uint64_t goodEnd() const { return good_end_; }

  // Tables as read so far. name(): "" when unknown; label(): the name or "#id".
  std::string_view name(std::uint32_t id) const;
  std::string label(std::uint32_t id) const;
  std::span<const StackFrame> stack(std::uint32_t id) const;

  bool sawClose() const { return saw_close_; }
  std::uint64_t recordsRead() const { return records_read_; }  // delivered, tables included
  std::uint64_t unknownSkipped() const { return unknown_skipped_; }

 private:
  bool fill(std::size_t need);  // make `need` bytes available at pos_; false at EOF/error
  std::string readHeader();
  bool loadChunk();
  bool decode(Record& r, const char* p, std::uint32_t type, std::uint32_t payload);
  bool setError(ReadStatus s, std::uint64_t offset, const std::string& what);

  std::string name_;
  int fd_ = -1;
  bool eof_ = false;
  // Window of the file in memory: data_[0] is at file offset base_; pos_ is the read position.
  const char* data_ = nullptr;
  std::size_t avail_ = 0;
  std::size_t pos_ = 0;
  std::uint64_t base_ = 0;
  std::vector<char> buf_;

  // Records of the current chunk: [rec_pos_, chunk_end_) within the window.
  std::size_t rec_pos_ = 0;
  std::size_t chunk_end_ = 0;
  std::uint32_t chunk_thread_ = 0;
  std::uint32_t chunk_expected_ = 0;
  std::uint32_t chunk_seen_ = 0;
  std::uint64_t chunk_offset_ = 0;
  bool chunk_partial_ = false;  // the file ends inside this chunk (no checksum to check)
  bool in_chunk_ = false;

  FileHeader header_;
  std::string header_strings_[4];
  ReadStatus status_ = ReadStatus::kOk;
  std::string error_;
  std::uint64_t good_end_ = 0;
  bool saw_close_ = false;
  std::uint64_t records_read_ = 0;
  std::uint64_t unknown_skipped_ = 0;

  std::unordered_map<std::uint32_t, std::string> strings_;
  std::unordered_map<std::uint32_t, std::vector<StackFrame>> stacks_;
  std::vector<std::uint64_t> ids_;       // the current launch's buffer ids (aligned copy)
  std::vector<StackFrame> frames_;       // the current stack record's frames
};

// "kEnd" -> "end", ... for messages and tests.
const char* readStatusName(ReadStatus s);

}  // namespace delta::trace
