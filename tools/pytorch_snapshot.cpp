// The PyTorch memory snapshot export. Each buffer the shim saw allocated is its own VMM mapping,
// so it is a segment of one block in PyTorch's terms, and the shim's moves are what PyTorch's
// expandable segments report as (un)mapping:
//   alloc         -> segment_alloc + alloc
//   free          -> free_requested + free_completed (+ segment_free if it was still mapped)
//   evict, drop   -> segment_unmap (the memory left the device; the program still holds it)
//   restore,
//   recompute     -> segment_map
// `segments` is the device memory at the end of the trace: the live buffers that are mapped,
// one active block each. The viewer replays device_traces backwards from that state, so the two
// must agree: a buffer that ends evicted has no segment, and one freed while evicted gets no
// segment_free (its unmap already took the segment away).
//
// Streams: device_traces goes out as the records are read; the only state is the live buffers.
#include "tools/pytorch_snapshot.h"

#include <fmt/core.h>

#include <cstdio>
#include <map>

#include "tools/export_file.h"
#include "trace/trace_reader.h"

namespace delta::tools {

namespace {

// Opcodes of pickle protocols 0-2 (Python's Lib/pickletools.py documents them).
constexpr char kProto = '\x80';
constexpr char kStop = '.';
constexpr char kMark = '(';
constexpr char kNone = 'N';
constexpr char kNewTrue = '\x88';
constexpr char kNewFalse = '\x89';
constexpr char kBinInt = 'J';   // 4-byte signed
constexpr char kBinInt1 = 'K';  // 1-byte unsigned
constexpr char kBinInt2 = 'M';  // 2-byte unsigned
constexpr char kLong1 = '\x8a';  // 1-byte length, then little-endian two's complement
constexpr char kBinUnicode = 'X';  // 4-byte length, then UTF-8
constexpr char kEmptyDict = '}';
constexpr char kSetItems = 'u';
constexpr char kEmptyList = ']';
constexpr char kAppends = 'e';
constexpr char kTuple = 't';

void putLe(std::string& out, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

void PickleWriter::begin() {
  out_.push_back(kProto);
  out_.push_back('\x02');
}

void PickleWriter::end() { out_.push_back(kStop); }

void PickleWriter::beforeValue() {
  if (frames_.empty() || frames_.back().kind != Kind::kList) return;
  Frame& f = frames_.back();
  if (f.pending == kBatch) {
    out_.push_back(kAppends);
    f.pending = 0;
  }
  if (f.pending == 0) out_.push_back(kMark);
  ++f.pending;
}

void PickleWriter::none() {
  beforeValue();
  out_.push_back(kNone);
}

void PickleWriter::boolean(bool v) {
  beforeValue();
  out_.push_back(v ? kNewTrue : kNewFalse);
}

// The shortest form, as Python's pickler picks it: the bytes match pickle.dumps(v, 2).
void PickleWriter::integer(std::int64_t v) {
  beforeValue();
  if (v >= 0 && v <= 0xff) {
    out_.push_back(kBinInt1);
    putLe(out_, static_cast<std::uint64_t>(v), 1);
  } else if (v >= 0 && v <= 0xffff) {
    out_.push_back(kBinInt2);
    putLe(out_, static_cast<std::uint64_t>(v), 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    out_.push_back(kBinInt);
    putLe(out_, static_cast<std::uint64_t>(v), 4);
  } else {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xff);
    // Drop high bytes that only repeat the sign.
    int n = 8;
    while (n > 1 && ((b[n - 1] == 0x00 && !(b[n - 2] & 0x80)) || (b[n - 1] == 0xff && (b[n - 2] & 0x80)))) --n;
    out_.push_back(kLong1);
    out_.push_back(static_cast<char>(n));
    out_.append(reinterpret_cast<const char*>(b), static_cast<std::size_t>(n));
  }
}

void PickleWriter::unsignedInteger(std::uint64_t v) {
  if (v <= static_cast<std::uint64_t>(INT64_MAX)) return integer(static_cast<std::int64_t>(v));
  beforeValue();
  // The top bit is set: a ninth, zero byte keeps it positive.
  out_.push_back(kLong1);
  out_.push_back('\x09');
  putLe(out_, v, 8);
  out_.push_back('\x00');
}

void PickleWriter::string(std::string_view utf8) {
  beforeValue();
  out_.push_back(kBinUnicode);
  putLe(out_, utf8.size(), 4);
  out_.append(utf8);
}

void PickleWriter::beginDict() {
  beforeValue();
  out_.push_back(kEmptyDict);
  frames_.push_back({Kind::kDict});
}

void PickleWriter::key(std::string_view k) {
  Frame& f = frames_.back();
  if (f.pending == kBatch) {
    out_.push_back(kSetItems);
    f.pending = 0;
  }
  if (f.pending == 0) out_.push_back(kMark);
  ++f.pending;
  // Written as a bare string: beforeValue() would count it as an item of an enclosing list.
  out_.push_back(kBinUnicode);
  putLe(out_, k.size(), 4);
  out_.append(k);
}

void PickleWriter::endDict() {
  if (frames_.back().pending > 0) out_.push_back(kSetItems);
  frames_.pop_back();
}

void PickleWriter::beginList() {
  beforeValue();
  out_.push_back(kEmptyList);
  frames_.push_back({Kind::kList});
}

void PickleWriter::endList() {
  if (frames_.back().pending > 0) out_.push_back(kAppends);
  frames_.pop_back();
}

// Tuples are built whole from one MARK (they are immutable): only small ones belong here.
void PickleWriter::beginTuple() {
  beforeValue();
  out_.push_back(kMark);
  frames_.push_back({Kind::kTuple});
}

void PickleWriter::endTuple() {
  out_.push_back(kTuple);
  frames_.pop_back();
}

namespace {

using trace::Record;
using trace::RecordType;

struct LiveBuffer {
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
  std::uint64_t stream = 0;
  std::uint32_t stack = 0;
  bool mapped = true;
};

class SnapshotWriter {
 public:
  SnapshotWriter(PickleWriter& p, const trace::TraceReader& reader) : p_(p), reader_(reader) {
    const trace::FileHeader& h = reader.header();
    start_mono_ = h.start_monotonic_ns;
    start_real_ = h.start_realtime_ns;
  }

  // PyTorch stamps entries with the wall clock; the trace's times are monotonic from its start.
  std::int64_t timeUs(std::uint64_t t) const {
    const std::uint64_t rel = t > start_mono_ ? t - start_mono_ : 0;
    return static_cast<std::int64_t>((start_real_ + rel) / 1000);
  }

  // Symbol names where the shim resolved them, else the return address: the viewer shows
  // "filename:line:name", and a bare address is still something to look up.
  void frames(std::uint32_t stack) {
    p_.beginList();
    if (stack != 0) {
      for (const trace::StackFrame& f : reader_.stack(stack)) {
        p_.beginDict();
        p_.key("filename");
        p_.string("");
        p_.key("line");
        p_.integer(0);
        p_.key("name");
        const std::string_view sym = f.name != 0 ? reader_.name(f.name) : std::string_view();
        p_.string(sym.empty() ? fmt::format("0x{:x}", f.address) : std::string(sym));
        p_.endDict();
      }
    }
    p_.endList();
  }

  void entry(const char* action, const LiveBuffer& b, std::uint64_t time_ns) {
    p_.beginDict();
    p_.key("action");
    p_.string(action);
    p_.key("addr");
    p_.unsignedInteger(b.address);
    p_.key("size");
    p_.unsignedInteger(b.bytes);
    p_.key("stream");
    p_.unsignedInteger(b.stream);
    p_.key("time_us");
    p_.integer(timeUs(time_ns));
    p_.key("frames");
    frames(b.stack);
    p_.endDict();
  }

  void segment(const LiveBuffer& b) {
    p_.beginDict();
    p_.key("device");
    p_.integer(0);
    p_.key("address");
    p_.unsignedInteger(b.address);
    for (const char* k : {"total_size", "allocated_size", "active_size", "requested_size"}) {
      p_.key(k);
      p_.unsignedInteger(b.bytes);
    }
    p_.key("stream");
    p_.unsignedInteger(b.stream);
    // PyTorch's split between pools of blocks up to 1 MiB and larger ones.
    p_.key("segment_type");
    p_.string(b.bytes <= (1u << 20) ? "small" : "large");
    p_.key("segment_pool_id");
    p_.beginTuple();
    p_.integer(0);
    p_.integer(0);
    p_.endTuple();
    p_.key("is_expandable");
    p_.boolean(true);
    p_.key("frames");
    frames(b.stack);
    p_.key("blocks");
    p_.beginList();
    p_.beginDict();
    p_.key("address");
    p_.unsignedInteger(b.address);
    p_.key("size");
    p_.unsignedInteger(b.bytes);
    p_.key("requested_size");
    p_.unsignedInteger(b.bytes);
    p_.key("state");
    p_.string("active_allocated");
    p_.key("frames");
    frames(b.stack);
    p_.endDict();
    p_.endList();
    p_.endDict();
  }

 private:
  PickleWriter& p_;
  const trace::TraceReader& reader_;
  std::uint64_t start_mono_ = 0;
  std::uint64_t start_real_ = 0;
};

}  // namespace

int exportPytorchSnapshot(const std::string& input, const std::string& output) {
  trace::TraceReader reader;
  if (std::string err = reader.open(input); !err.empty()) {
    fmt::print(stderr, "delta-trace export: {}\n", err);
    return 1;
  }
  ExportFile file(output, true);
  std::FILE* out = file.file();
  if (out == nullptr) return 1;
  PickleWriter p;
  SnapshotWriter w(p, reader);
  auto drain = [&] {
    const std::string bytes = p.take();
    std::fwrite(bytes.data(), 1, bytes.size(), out);
  };

  p.begin();
  p.beginDict();
  p.key("device_traces");
  p.beginList();
  p.beginList();  // device 0: a trace is one process on one device
  std::map<std::uint64_t, LiveBuffer> live;  // by buffer id
  Record r;
  while (reader.next(r)) {
    switch (r.type) {
      case RecordType::kAlloc: {
        const trace::AllocRecord& a = r.alloc;
        const LiveBuffer b{a.address, a.bytes, a.stream, a.stack, true};
        live[a.buffer] = b;
        w.entry("segment_alloc", b, a.time_ns);
        w.entry("alloc", b, a.time_ns);
        break;
      }
      case RecordType::kFree: {
        // A buffer allocated before the trace began (or whose record was dropped) has no
        // address to name: it is left out rather than drawn at 0.
        auto it = live.find(r.free.buffer);
        if (it == live.end()) break;
        w.entry("free_requested", it->second, r.free.time_ns);
        w.entry("free_completed", it->second, r.free.time_ns);
        if (it->second.mapped) w.entry("segment_free", it->second, r.free.time_ns);
        live.erase(it);
        break;
      }
      case RecordType::kEvict:
      case RecordType::kRestore:
      case RecordType::kRecompute: {
        auto it = live.find(r.movement.buffer);
        if (it == live.end()) break;
        const bool map = r.type != RecordType::kEvict;
        if (it->second.mapped == map) break;  // nothing changed on the device
        it->second.mapped = map;
        w.entry(map ? "segment_map" : "segment_unmap", it->second, r.movement.start_ns);
        break;
      }
      default:
        break;
    }
    if (p.bytes().size() >= (1u << 20)) drain();
  }
  p.endList();
  p.endList();
  p.key("segments");
  p.beginList();
  for (const auto& [id, b] : live) {
    if (b.mapped) w.segment(b);
  }
  p.endList();
  p.endDict();
  p.end();
  drain();
  return file.finish(reader);
}

}  // namespace delta::tools
