// A library rtld_next_probe.cpp opens with dlopen, long after libdelta.so's constructors.
#include <dlfcn.h>

extern "C" __attribute__((visibility("default"))) void* rtldNextFromLate(const char* name) {
  void* found = dlsym(RTLD_NEXT, name);
  asm volatile("" ::: "memory");  // no tail call: glibc goes by dlsym's return address
  return found;
}

extern "C" __attribute__((visibility("default"))) void* rtldDefaultFromLate(const char* name) {
  void* found = dlsym(RTLD_DEFAULT, name);
  asm volatile("" ::: "memory");
  return found;
}
