// Whether an address lies in executable memory (code), from /proc/self/maps.
//
// A runtime launch names its kernel by a pointer that is either a host stub (code, in the
// program or a library) or a kernel handle (a cudaKernel_t: an object in the runtime's data).
// When the runtime does not know a pointer as a stub, only a handle may be given to the
// driver's cuKernel* calls: the driver does not validate handles, and a stub of another
// runtime instance (a library that links the runtime statically) is code, never a handle.
#pragma once

namespace delta::shim {

// True for code, and for what cannot be told (an unmapped address, /proc unreadable): the
// answer that keeps such a pointer away from the driver. Reads /proc/self/maps with a stack
// buffer (no allocation); meant for once per distinct kernel, not per launch.
bool isCodeOrUnknownAddress(const void* address);

}  // namespace delta::shim
