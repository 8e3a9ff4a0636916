// Call stacks of managed allocations (DELTA_TRACE_STACKS=1), for the trace's Stack table: the
// program's frames (the shim's own left out), stored once per distinct stack with the symbol
// names found then, and referred to by each Alloc record. `delta-trace summary` ranks the
// allocation sites; the PyTorch snapshot export carries the frames.
//
// The unwinder is libunwind's unw_backtrace, loaded with dlopen when stacks are first wanted
// (RTLD_LOCAL: its exported unwinder symbols must not replace the program's), so the shim stays
// glibc-only at load time; where libunwind is missing, glibc's backtrace(). Cost per
// allocation: one unwind, one hash and one lookup under a lock; names are resolved (dladdr)
// only the first time a stack is seen.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "trace/trace_writer.h"

namespace delta::shim {

class CallStacks {
 public:
  CallStacks();
  // The calling thread's stack as a stack id of `trace` (0: none could be taken).
  uint32_t capture(trace::TraceWriter& trace);
  // "libunwind" or "glibc backtrace", for the verbose line.
  const char* unwinder() const { return unwinderName_; }

 private:
  using Backtrace = int (*)(void** buffer, int size);
  static constexpr int kMaxFrames = 64;

  Backtrace backtrace_ = nullptr;
  const char* unwinderName_ = "none";
  // libdelta.so's code: frames there are the shim's, not the program's.
  uintptr_t selfStart_ = 0;
  uintptr_t selfEnd_ = 0;
  std::mutex mutex_;
  std::unordered_map<uint64_t, uint32_t> ids_;  // hash of the return addresses -> stack id
};

}  // namespace delta::shim
