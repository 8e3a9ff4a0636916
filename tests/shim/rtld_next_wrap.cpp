// A library that interposes on a libc function the usual way, finding the real one with
// dlsym(RTLD_NEXT, ...): under LD_PRELOAD=libdelta.so it is loaded after the shim, as a
// sanitizer runtime is. See rtld_next_probe.cpp.
#include <dlfcn.h>
#include <string.h>

extern "C" {

__attribute__((visibility("default"))) void* rtldNextFromWrap(const char* name) {
  void* found = dlsym(RTLD_NEXT, name);
  asm volatile("" ::: "memory");  // no tail call: glibc goes by dlsym's return address
  return found;
}

// Forwards to the next definition; resolving to itself would recurse until the stack ends.
__attribute__((visibility("default"))) int strverscmp(const char* a, const char* b) noexcept {
  using Function = int (*)(const char*, const char*);
  static Function next = reinterpret_cast<Function>(dlsym(RTLD_NEXT, "strverscmp"));
  return next(a, b);
}

}
