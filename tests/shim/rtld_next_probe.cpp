// dlsym(RTLD_NEXT/RTLD_DEFAULT, ...) from the program, from a linked library that interposes
// on libc (rtld_next_wrap.cpp) and from a library opened with dlopen (rtld_next_late.cpp).
// Prints, for each lookup, the object the answer lies in; rtld_next_test.sh checks that the
// lines are the same with and without LD_PRELOAD=libdelta.so. Also checks, on its own, that
// the wrapper's RTLD_NEXT is libc's function and that calling through the wrapper returns.
//   rtld-next-probe LATE_LIBRARY
#include <dlfcn.h>
#include <string.h>

#include <cstdio>

extern "C" void* rtldNextFromWrap(const char* name);

namespace {

// The file name of the object `address` lies in, without its directory.
const char* objectOf(void* address) {
  if (address == nullptr) return "(null)";
  Dl_info info;
  if (dladdr(address, &info) == 0 || info.dli_fname == nullptr) return "(unknown)";
  const char* slash = strrchr(info.dli_fname, '/');
  return slash != nullptr ? slash + 1 : info.dli_fname;
}

int failures = 0;

void expect(bool condition, const char* what) {
  if (condition) return;
  std::fprintf(stderr, "FAILED: %s\n", what);
  ++failures;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: rtld-next-probe LATE_LIBRARY\n");
    return 2;
  }
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  expect(libc != nullptr, "libc.so.6 is loaded");
  void* libcStrverscmp = libc != nullptr ? dlsym(libc, "strverscmp") : nullptr;
  void* libcGetenv = libc != nullptr ? dlsym(libc, "getenv") : nullptr;

  void* wrapNext = rtldNextFromWrap("strverscmp");
  expect(wrapNext != nullptr && wrapNext == libcStrverscmp,
         "the wrapping library's RTLD_NEXT strverscmp is libc's");
  expect(strverscmp("a9", "a10") < 0, "strverscmp through the wrapper");

  void* programNext = dlsym(RTLD_NEXT, "strverscmp");
  void* programDefault = dlsym(RTLD_DEFAULT, "strverscmp");
  expect(programNext == programDefault, "the program's RTLD_NEXT strverscmp is the wrapper's");
  expect(dlsym(RTLD_NEXT, "getenv") == libcGetenv, "the program's RTLD_NEXT getenv is libc's");

  void* late = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  expect(late != nullptr, "dlopen of the late library");
  void* lateNext = nullptr;
  void* lateDefault = nullptr;
  if (late != nullptr) {
    auto next = reinterpret_cast<void* (*)(const char*)>(dlsym(late, "rtldNextFromLate"));
    auto byDefault = reinterpret_cast<void* (*)(const char*)>(dlsym(late, "rtldDefaultFromLate"));
    expect(next != nullptr && byDefault != nullptr, "the late library's functions");
    if (next != nullptr) lateNext = next("strverscmp");
    if (byDefault != nullptr) lateDefault = byDefault("strverscmp");
  }

  std::printf("wrap RTLD_NEXT strverscmp: %s\n", objectOf(wrapNext));
  std::printf("program RTLD_NEXT strverscmp: %s\n", objectOf(programNext));
  std::printf("program RTLD_DEFAULT strverscmp: %s\n", objectOf(programDefault));
  std::printf("late RTLD_NEXT strverscmp: %s\n", objectOf(lateNext));
  std::printf("late RTLD_DEFAULT strverscmp: %s\n", objectOf(lateDefault));
  std::printf("late RTLD_NEXT is libc's: %s\n", lateNext == libcStrverscmp ? "yes" : "no");
  return failures == 0 ? 0 : 1;
}
