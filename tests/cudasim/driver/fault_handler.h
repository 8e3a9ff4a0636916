// Turns a touch of unmapped device memory into the report a GPU would give: the address,
// the call that enqueued the work, the kernel, and the stream; then the process aborts.
// Work running on a stream worker says what it is through setCurrentWork().
#pragma once

#include <cstdint>

namespace cudasim {

class DeviceMemory;

struct WorkLabel {
  const char* call;    // the API call that enqueued the work
  const char* kernel;  // the kernel's registered name, or nullptr for copies and memsets
  uint64_t stream;     // the stream's id
};

// Installs the SIGSEGV/SIGBUS handler once. Faults outside the device address space go to
// whatever handler was there before (or the default action).
void installFaultHandler(const DeviceMemory* memory);

// The work this thread is running now (nullptr: host code).
void setCurrentWork(const WorkLabel* label);

// The same report and abort, for a touch found without a fault: a copy engine's, which reaches
// device memory through its physical pages (DeviceMemory::physicalPieces).
[[noreturn]] void reportIllegalAddress(uint64_t address);

}  // namespace cudasim
