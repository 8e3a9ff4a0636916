// TraceReader: see trace_reader.h. Every length read from the file is checked against what is
// left of its chunk (or the file) before it is used: the fuzz target holds it to that.
#include "trace/trace_reader.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>

namespace delta::trace {

namespace {

constexpr std::size_t kReadBlock = 1 << 20;

template <class T>
T get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::uint32_t fixedPayload(RecordType t) {
  switch (t) {
    case RecordType::kAlloc: return kAllocBytes;
    case RecordType::kFree: return kFreeBytes;
    case RecordType::kCopy: return kCopyBytes;
    case RecordType::kMemset: return kMemsetBytes;
    case RecordType::kEvict:
    case RecordType::kRestore:
    case RecordType::kRecompute: return kMovementBytes;
    case RecordType::kBudgetChange: return kBudgetChangeBytes;
    case RecordType::kOverBudget: return kOverBudgetBytes;
    case RecordType::kIteration: return kIterationBytes;
    case RecordType::kClose: return kCloseBytes;
    case RecordType::kPlan: return kPlanBytes;
    case RecordType::kString: return kStringFixedBytes;
    case RecordType::kStack: return kStackFixedBytes;
    case RecordType::kLaunch: return kLaunchFixedBytes;
  }
  return 0;
}

bool variableSize(RecordType t) {
  return t == RecordType::kString || t == RecordType::kStack || t == RecordType::kLaunch;
}

}  // namespace

const char* readStatusName(ReadStatus s) {
  switch (s) {
    case ReadStatus::kOk: return "ok";
    case ReadStatus::kEnd: return "end";
    case ReadStatus::kTruncated: return "truncated";
    case ReadStatus::kCorrupt: return "corrupt";
    case ReadStatus::kForeign: return "foreign";
    case ReadStatus::kNewerVersion: return "newer-version";
    case ReadStatus::kIoError: return "io-error";
  }
  return "?";
}

TraceReader::~TraceReader() {
  if (fd_ >= 0) ::close(fd_);
}

std::string TraceReader::open(const std::string& path) {
  name_ = path;
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    status_ = ReadStatus::kIoError;
    error_ = path + ": cannot open: " + std::strerror(errno);
    return error_;
  }
  buf_.resize(kReadBlock);
  data_ = buf_.data();
  return readHeader();
}

std::string TraceReader::openMemory(std::string_view bytes, std::string name) {
  name_ = std::move(name);
  data_ = bytes.data();
  avail_ = bytes.size();
  eof_ = true;
  return readHeader();
}

bool TraceReader::setError(ReadStatus s, std::uint64_t offset, const std::string& what) {
  status_ = s;
  error_ = name_ + ": " + what + " at byte offset " + std::to_string(offset);
  if (s == ReadStatus::kTruncated || s == ReadStatus::kCorrupt) {
    error_ += " (records before byte offset " + std::to_string(good_end_) + " are valid)";
  }
  return false;
}

bool TraceReader::fill(std::size_t need) {
  if (avail_ - pos_ >= need) return true;
  if (fd_ < 0 || eof_) return false;
  // Keep the unread part (and the current chunk's records, which start at rec_pos_).
  const std::size_t keep_from = in_chunk_ ? std::min(pos_, rec_pos_) : pos_;
  const std::size_t kept = avail_ - keep_from;
  if (keep_from != 0) {
    std::memmove(buf_.data(), buf_.data() + keep_from, kept);
    base_ += keep_from;
    pos_ -= keep_from;
    rec_pos_ -= std::min(rec_pos_, keep_from);
    chunk_end_ -= std::min(chunk_end_, keep_from);
    avail_ = kept;
  }
  const std::size_t want = std::max(pos_ + need, kReadBlock);
  if (buf_.size() < want) buf_.resize(want);
  data_ = buf_.data();
  while (avail_ - pos_ < need) {
    const ssize_t n = ::read(fd_, buf_.data() + avail_, buf_.size() - avail_);
    if (n < 0) {
      if (errno == EINTR) continue;
      setError(ReadStatus::kIoError, base_ + avail_, std::string("read failed (") + std::strerror(errno) + ")");
      return false;
    }
    if (n == 0) {
      eof_ = true;
      return false;
    }
    avail_ += static_cast<std::size_t>(n);
  }
  return true;
}

std::string TraceReader::readHeader() {
  const bool have_magic = fill(sizeof kMagic);
  if (status_ == ReadStatus::kIoError) return error_;
  const std::size_t have = avail_ - pos_;
  const bool magic_ok =
      std::memcmp(data_ + pos_, kMagic, std::min(have, sizeof kMagic)) == 0;
  if (!magic_ok || (!have_magic && have == 0)) {
    status_ = ReadStatus::kForeign;
    error_ = name_ + ": not a DELTA trace (" +
             (have == 0 ? std::string("the file is empty")
                        : "it does not start with \"DELTATRC\"") +
             ")";
    return error_;
  }
  if (!fill(kFileHeaderFixed)) {
    if (status_ == ReadStatus::kOk) setError(ReadStatus::kTruncated, base_ + avail_, "the trace header is cut short");
    return error_;
  }
  const char* p = data_ + pos_;
  const auto version = get<std::uint16_t>(p + 8);
  const auto body = get<std::uint32_t>(p + 12);
  if (version > kFormatVersion || version == 0) {
    status_ = ReadStatus::kNewerVersion;
    error_ = name_ + ": trace format version " + std::to_string(version) +
             (version == 0 ? " is not valid" : " is newer than this reader's (" +
                                                   std::to_string(kFormatVersion) +
                                                   "): use a newer delta-trace");
    return error_;
  }
  if (get<std::uint16_t>(p + 10) != 0) {
    setError(ReadStatus::kCorrupt, 10, "the trace header's reserved field is not 0");
    return error_;
  }
  if (body > kMaxHeaderBody || body < 8 * 4 + 4 + 4 + 4 * 2 + 8) {
    setError(ReadStatus::kCorrupt, 12, "the trace header length " + std::to_string(body) + " is not valid");
    return error_;
  }
  if (!fill(kFileHeaderFixed + body)) {
    if (status_ == ReadStatus::kOk) setError(ReadStatus::kTruncated, base_ + avail_, "the trace header is cut short");
    return error_;
  }
  p = data_ + pos_;
  const char* f = p + kFileHeaderFixed;
  const std::size_t fields = body - 8;
  if (checksum(f, fields) != get<std::uint64_t>(f + fields)) {
    setError(ReadStatus::kCorrupt, kFileHeaderFixed, "the trace header fails its checksum");
    return error_;
  }
  header_.format_version = version;
  header_.start_realtime_ns = get<std::uint64_t>(f);
  header_.start_monotonic_ns = get<std::uint64_t>(f + 8);
  header_.device_memory = get<std::uint64_t>(f + 16);
  header_.budget = get<std::uint64_t>(f + 24);
  header_.pid = get<std::uint32_t>(f + 32);
  header_.rank = get<std::int32_t>(f + 36);
  std::size_t at = 40;
  for (std::string& s : header_strings_) {
    if (at + 2 > fields) {
      setError(ReadStatus::kCorrupt, kFileHeaderFixed + at, "a trace header string is out of bounds");
      return error_;
    }
    const auto n = get<std::uint16_t>(f + at);
    if (at + 2 + n > fields) {
      setError(ReadStatus::kCorrupt, kFileHeaderFixed + at, "a trace header string is out of bounds");
      return error_;
    }
    s.assign(f + at + 2, n);
    at += 2 + n;
  }
  header_.producer = header_strings_[0];
  header_.device_name = header_strings_[1];
  header_.policy = header_strings_[2];
  header_.options = header_strings_[3];
  pos_ += kFileHeaderFixed + body;
  good_end_ = base_ + pos_;
  return {};
}

bool TraceReader::loadChunk() {
  in_chunk_ = false;
  if (!fill(kChunkHeaderBytes)) {
    if (status_ != ReadStatus::kOk) return false;
    if (avail_ == pos_) {
      status_ = ReadStatus::kEnd;
      return false;
    }
    return setError(ReadStatus::kTruncated, base_ + pos_,
                    "the file ends inside a chunk header (" + std::to_string(avail_ - pos_) +
                        " of " + std::to_string(kChunkHeaderBytes) + " bytes)");
  }
  const char* h = data_ + pos_;
  const std::uint64_t offset = base_ + pos_;
  if (get<std::uint32_t>(h) != kChunkTag) return setError(ReadStatus::kCorrupt, offset, "bad chunk tag");
  const auto bytes = get<std::uint32_t>(h + 4);
  if (bytes > kMaxChunkPayload) {
    return setError(ReadStatus::kCorrupt, offset, "chunk length " + std::to_string(bytes) + " is too large");
  }
  chunk_thread_ = get<std::uint32_t>(h + 8);
  chunk_expected_ = get<std::uint32_t>(h + 12);
  const auto sum = get<std::uint64_t>(h + 16);
  chunk_offset_ = offset;
  chunk_seen_ = 0;
  chunk_partial_ = !fill(kChunkHeaderBytes + bytes);
  if (status_ != ReadStatus::kOk) return false;
  h = data_ + pos_;
  rec_pos_ = pos_ + kChunkHeaderBytes;
  if (chunk_partial_) {
    // Cut short (a crash or a full disk mid-write): deliver the whole records that are there.
    chunk_end_ = avail_;
  } else {
    chunk_end_ = rec_pos_ + bytes;
    if (chunkChecksum(data_ + rec_pos_, bytes, chunk_thread_, chunk_expected_) != sum) {
      return setError(ReadStatus::kCorrupt, offset,
                      "chunk of " + std::to_string(bytes) + " bytes fails its checksum");
    }
  }
  pos_ = chunk_end_;
  in_chunk_ = true;
  return true;
}

bool TraceReader::next(Record& r) {
  if (status_ != ReadStatus::kOk) return false;
  for (;;) {
    if (!in_chunk_ || rec_pos_ == chunk_end_) {
      if (in_chunk_) {
        if (chunk_partial_) {
          return setError(ReadStatus::kTruncated, base_ + chunk_end_,
                          "the file ends inside a chunk (its checksum could not be checked)");
        }
        if (chunk_seen_ != chunk_expected_) {
          return setError(ReadStatus::kCorrupt, chunk_offset_,
                          "chunk holds " + std::to_string(chunk_seen_) + " records, its header says " +
                              std::to_string(chunk_expected_));
        }
      }
      if (!loadChunk()) return false;
      continue;
    }
    const std::uint64_t offset = base_ + rec_pos_;
    const std::size_t left = chunk_end_ - rec_pos_;
    if (left < kRecordHeaderBytes) {
      if (chunk_partial_) return setError(ReadStatus::kTruncated, offset, "the file ends inside a record");
      return setError(ReadStatus::kCorrupt, offset, "stray bytes at the end of a chunk");
    }
    const auto word = get<std::uint32_t>(data_ + rec_pos_);
    const std::uint32_t type = word & 0xff;
    const std::uint32_t payload = word >> 8;
    if (type == 0) return setError(ReadStatus::kCorrupt, offset, "record of type 0");
    if (left - kRecordHeaderBytes < payload) {
      if (chunk_partial_) return setError(ReadStatus::kTruncated, offset, "the file ends inside a record");
      return setError(ReadStatus::kCorrupt, offset,
                      "record of " + std::to_string(payload) + " bytes overruns its chunk");
    }
    const char* p = data_ + rec_pos_ + kRecordHeaderBytes;
    rec_pos_ += kRecordHeaderBytes + payload;
    chunk_seen_++;
    if (type > kLastRecordType) {
      unknown_skipped_++;  // a newer writer's record: skip it
      good_end_ = base_ + rec_pos_;
      continue;
    }
    r.type = static_cast<RecordType>(type);
    r.offset = offset;
    r.size = kRecordHeaderBytes + payload;
    r.thread = chunk_thread_;
    if (!decode(r, p, type, payload)) return false;
    good_end_ = base_ + rec_pos_;
    records_read_++;
    return true;
  }
}

bool TraceReader::decode(Record& r, const char* p, std::uint32_t type_value, std::uint32_t payload) {
  const auto type = static_cast<RecordType>(type_value);
  const std::uint32_t fixed = fixedPayload(type);
  if (payload < fixed || (!variableSize(type) && payload != fixed)) {
    return setError(ReadStatus::kCorrupt, r.offset,
                    std::string(recordTypeName(type)) + " record of " + std::to_string(payload) +
                        " bytes (expected " + (variableSize(type) ? "at least " : "") +
                        std::to_string(fixed) + ")");
  }
  switch (type) {
    case RecordType::kString: {
      r.string = StringRecord{get<std::uint32_t>(p), std::string_view(p + 4, payload - 4)};
      strings_[r.string.id].assign(r.string.text);
      return true;
    }
    case RecordType::kStack: {
      const auto id = get<std::uint32_t>(p);
      const auto n = get<std::uint32_t>(p + 4);
      if (static_cast<std::uint64_t>(n) * kStackFrameBytes != payload - kStackFixedBytes) {
        return setError(ReadStatus::kCorrupt, r.offset, "Stack record's frame count does not match its length");
      }
      frames_.resize(n);
      for (std::uint32_t i = 0; i < n; ++i) {
        const char* f = p + 8 + 12 * static_cast<std::size_t>(i);
        frames_[i] = StackFrame{get<std::uint64_t>(f), get<std::uint32_t>(f + 8)};
      }
      stacks_[id] = frames_;
      r.stack = StackRecord{id, frames_};
      return true;
    }
    case RecordType::kAlloc: {
      AllocRecord& a = r.alloc;
      a.time_ns = get<std::uint64_t>(p);
      a.buffer = get<std::uint64_t>(p + 8);
      a.address = get<std::uint64_t>(p + 16);
      a.bytes = get<std::uint64_t>(p + 24);
      a.stream = get<std::uint64_t>(p + 32);
      a.stack = get<std::uint32_t>(p + 40);
      a.flags = get<std::uint8_t>(p + 44);
      return true;
    }
    case RecordType::kFree: {
      FreeRecord& f = r.free;
      f.time_ns = get<std::uint64_t>(p);
      f.buffer = get<std::uint64_t>(p + 8);
      f.bytes = get<std::uint64_t>(p + 16);
      const auto where = get<std::uint8_t>(p + 24);
      if (where > 3) return setError(ReadStatus::kCorrupt, r.offset, "Free record with an unknown residency");
      f.residency = static_cast<Residency>(where);
      return true;
    }
    case RecordType::kLaunch: {
      LaunchRecord& l = r.launch;
      l.time_ns = get<std::uint64_t>(p);
      l.stream = get<std::uint64_t>(p + 8);
      l.kernel = get<std::uint32_t>(p + 16);
      std::memcpy(l.grid, p + 20, 12);
      std::memcpy(l.block, p + 32, 12);
      l.flags = get<std::uint8_t>(p + 44);
      const auto n = get<std::uint32_t>(p + 45);
      if (static_cast<std::uint64_t>(n) * 8 != payload - kLaunchFixedBytes) {
        return setError(ReadStatus::kCorrupt, r.offset, "Launch record's buffer count does not match its length");
      }
      ids_.resize(n);
      if (n != 0) std::memcpy(ids_.data(), p + kLaunchFixedBytes, 8 * static_cast<std::size_t>(n));
      l.buffers = ids_;
      return true;
    }
    case RecordType::kCopy: {
      CopyRecord& c = r.copy;
      c.time_ns = get<std::uint64_t>(p);
      c.bytes = get<std::uint64_t>(p + 8);
      c.stream = get<std::uint64_t>(p + 16);
      c.dst = get<std::uint64_t>(p + 24);
      c.src = get<std::uint64_t>(p + 32);
      const auto kind = get<std::uint8_t>(p + 40);
      if (kind > 5) return setError(ReadStatus::kCorrupt, r.offset, "Copy record with an unknown kind");
      c.kind = static_cast<CopyKind>(kind);
      return true;
    }
    case RecordType::kMemset: {
      MemsetRecord& m = r.memset;
      m.time_ns = get<std::uint64_t>(p);
      m.buffer = get<std::uint64_t>(p + 8);
      m.bytes = get<std::uint64_t>(p + 16);
      m.stream = get<std::uint64_t>(p + 24);
      return true;
    }
    case RecordType::kEvict:
    case RecordType::kRestore:
    case RecordType::kRecompute: {
      MovementRecord& m = r.movement;
      m.start_ns = get<std::uint64_t>(p);
      m.end_ns = get<std::uint64_t>(p + 8);
      m.buffer = get<std::uint64_t>(p + 16);
      m.bytes = get<std::uint64_t>(p + 24);
      m.stall_ns = get<std::uint64_t>(p + 32);
      m.stream = get<std::uint64_t>(p + 40);
      m.kernel = get<std::uint32_t>(p + 48);
      m.flags = get<std::uint8_t>(p + 52);
      return true;
    }
    case RecordType::kBudgetChange: {
      r.budget.time_ns = get<std::uint64_t>(p);
      r.budget.budget = get<std::uint64_t>(p + 8);
      return true;
    }
    case RecordType::kOverBudget: {
      OverBudgetRecord& o = r.over_budget;
      o.time_ns = get<std::uint64_t>(p);
      o.kernel = get<std::uint32_t>(p + 8);
      o.working_set = get<std::uint64_t>(p + 12);
      o.budget = get<std::uint64_t>(p + 20);
      return true;
    }
    case RecordType::kIteration: {
      r.iteration.time_ns = get<std::uint64_t>(p);
      r.iteration.index = get<std::uint64_t>(p + 8);
      return true;
    }
    case RecordType::kPlan: {
      PlanRecord& o = r.plan;
      o.time_ns = get<std::uint64_t>(p);
      o.planning_ns = get<std::uint64_t>(p + 8);
      o.predicted_ns = get<std::int64_t>(p + 16);
      o.launches = get<std::uint32_t>(p + 24);
      o.name = get<std::uint32_t>(p + 28);
      o.flags = get<std::uint8_t>(p + 32);
      return true;
    }
    case RecordType::kClose: {
      CloseRecord& c = r.close;
      c.time_ns = get<std::uint64_t>(p);
      std::uint64_t* t[] = {&c.totals.peak_resident, &c.totals.bytes_h2d, &c.totals.bytes_d2h,
                            &c.totals.evictions, &c.totals.restores, &c.totals.recomputes,
                            &c.totals.stall_ns, &c.totals.over_budget_launches,
                            &c.records_written, &c.records_dropped};
      for (std::size_t i = 0; i < std::size(t); ++i) *t[i] = get<std::uint64_t>(p + 8 + 8 * i);
      saw_close_ = true;
      return true;
    }
  }
  return setError(ReadStatus::kCorrupt, r.offset, "unknown record type");
}

std::string_view TraceReader::name(std::uint32_t id) const {
  auto it = strings_.find(id);
  return it == strings_.end() ? std::string_view() : std::string_view(it->second);
}

std::string TraceReader::label(std::uint32_t id) const {
  auto it = strings_.find(id);
  if (it != strings_.end()) return it->second;
  return id == 0 ? std::string("(none)") : "#" + std::to_string(id);
}

std::span<const StackFrame> TraceReader::stack(std::uint32_t id) const {
  auto it = stacks_.find(id);
  if (it == stacks_.end()) return {};
  return it->second;
}

}  // namespace delta::trace
