// libFuzzer target: the trace reader must survive any bytes. Reads every record, looks up the
// names and stacks records refer to, and checks that an error always comes with a message.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "trace/trace_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace delta::trace;
  TraceReader reader;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (!reader.openMemory(bytes, "fuzz").empty()) return 0;
  Record r;
  std::uint64_t sink = 0;
  while (reader.next(r)) {
    if (r.offset + r.size > size) std::abort();
    switch (r.type) {
      case RecordType::kLaunch:
        for (std::uint64_t id : r.launch.buffers) sink += id;
        sink += reader.label(r.launch.kernel).size();
        break;
      case RecordType::kAlloc:
        sink += reader.stack(r.alloc.stack).size();
        break;
      default:
        break;
    }
  }
  if (reader.status() != ReadStatus::kEnd && reader.error().empty()) std::abort();
  if (reader.goodEnd() > size) std::abort();
  return static_cast<int>(sink & 0);
}
