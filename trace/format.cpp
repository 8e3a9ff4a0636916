// The non-inline parts of the trace format: names for messages, the file header encoder and the
// checksum. See format.h.
#include "trace/format.h"

namespace delta::trace {

const char* recordTypeName(RecordType t) {
  switch (t) {
    case RecordType::kString: return "String";
    case RecordType::kStack: return "Stack";
    case RecordType::kAlloc: return "Alloc";
    case RecordType::kFree: return "Free";
    case RecordType::kLaunch: return "Launch";
    case RecordType::kCopy: return "Copy";
    case RecordType::kMemset: return "Memset";
    case RecordType::kEvict: return "Evict";
    case RecordType::kRestore: return "Restore";
    case RecordType::kRecompute: return "Recompute";
    case RecordType::kBudgetChange: return "BudgetChange";
    case RecordType::kOverBudget: return "OverBudget";
    case RecordType::kIteration: return "Iteration";
    case RecordType::kClose: return "Close";
    case RecordType::kPlan: return "Plan";
  }
  return "Unknown";
}

const char* copyKindName(CopyKind k) {
  switch (k) {
    case CopyKind::kHostToHost: return "HtoH";
    case CopyKind::kHostToDevice: return "HtoD";
    case CopyKind::kDeviceToHost: return "DtoH";
    case CopyKind::kDeviceToDevice: return "DtoD";
    case CopyKind::kDefault: return "Default";
    case CopyKind::kPeer: return "Peer";
  }
  return "Unknown";
}

namespace {

char* putString(char* p, std::string_view s) {
  const std::uint16_t n = static_cast<std::uint16_t>(s.size() > 0xffff ? 0xffff : s.size());
  if (p == nullptr) return nullptr;
  p = detail::put(p, n);
  if (n != 0) std::memcpy(p, s.data(), n);
  return p + n;
}

std::size_t stringBytes(std::string_view s) { return 2 + (s.size() > 0xffff ? 0xffff : s.size()); }

}  // namespace

std::size_t encodeFileHeader(const FileHeader& h, char* out) {
  const std::size_t body = 8 * 4 + 4 + 4 + stringBytes(h.producer) + stringBytes(h.device_name) +
                           stringBytes(h.policy) + stringBytes(h.options) + 8;
  if (out == nullptr) return kFileHeaderFixed + body;
  using detail::put;
  char* p = out;
  std::memcpy(p, kMagic, sizeof kMagic);
  p += sizeof kMagic;
  p = put<std::uint16_t>(p, kFormatVersion);
  p = put<std::uint16_t>(p, 0);
  p = put<std::uint32_t>(p, static_cast<std::uint32_t>(body));
  char* const fields = p;
  p = put(p, h.start_realtime_ns);
  p = put(p, h.start_monotonic_ns);
  p = put(p, h.device_memory);
  p = put(p, h.budget);
  p = put(p, h.pid);
  p = put(p, h.rank);
  p = putString(p, h.producer);
  p = putString(p, h.device_name);
  p = putString(p, h.policy);
  p = putString(p, h.options);
  p = put(p, checksum(fields, static_cast<std::size_t>(p - fields)));
  return static_cast<std::size_t>(p - out);
}

std::uint64_t checksum(const void* data, std::size_t n) {
  constexpr std::uint64_t kMul = 0x9e3779b97f4a7c15ull;  // odd: multiplying is a bijection
  const auto* b = static_cast<const unsigned char*>(data);
  std::uint64_t h[4] = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull,
                        0x082efa98ec4e6c89ull};
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int lane = 0; lane < 4; ++lane) {
      std::uint64_t w;
      std::memcpy(&w, b + i + 8 * lane, 8);
      h[lane] = (h[lane] ^ w) * kMul;
    }
  }
  for (int lane = 0; i < n; ++lane, i += 8) {
    std::uint64_t w = 0;
    std::memcpy(&w, b + i, n - i < 8 ? n - i : 8);
    h[lane] = (h[lane] ^ w) * kMul;
  }
  std::uint64_t r = h[0] ^ std::rotl(h[1], 17) ^ std::rotl(h[2], 31) ^ std::rotl(h[3], 47) ^ n;
  r ^= r >> 33;
  r *= 0xff51afd7ed558ccdull;
  r ^= r >> 33;
  return r;
}

}  // namespace delta::trace
