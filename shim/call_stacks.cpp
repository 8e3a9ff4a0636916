#include "shim/call_stacks.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

namespace delta::shim {

namespace {

struct SelfRange {
  uintptr_t base;
  uintptr_t start;
  uintptr_t end;
};

int findSelf(struct dl_phdr_info* info, size_t, void* data) {
  auto& range = *static_cast<SelfRange*>(data);
  if (info->dlpi_addr != range.base) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& segment = info->dlpi_phdr[i];
    if (segment.p_type != PT_LOAD || !(segment.p_flags & PF_X)) continue;
    const uintptr_t start = info->dlpi_addr + segment.p_vaddr;
    if (range.start == 0 || start < range.start) range.start = start;
    range.end = std::max<uintptr_t>(range.end, start + segment.p_memsz);
  }
  return 1;
}

}  // namespace

CallStacks::CallStacks() {
  if (void* library = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL)) {
    backtrace_ = reinterpret_cast<Backtrace>(dlsym(library, "unw_backtrace"));
    if (backtrace_ != nullptr) unwinderName_ = "libunwind";
  }
  if (backtrace_ == nullptr) {
    backtrace_ = ::backtrace;
    unwinderName_ = "glibc backtrace";
  }
  Dl_info self{};
  if (dladdr(reinterpret_cast<const void*>(&findSelf), &self) != 0) {
    SelfRange range{reinterpret_cast<uintptr_t>(self.dli_fbase), 0, 0};
    dl_iterate_phdr(findSelf, &range);
    selfStart_ = range.start;
    selfEnd_ = range.end;
  }
}

uint32_t CallStacks::capture(trace::TraceWriter& trace) {
  void* frames[kMaxFrames];
  const int count = backtrace_(frames, kMaxFrames);
  uint64_t addresses[kMaxFrames];
  int n = 0;
  for (int i = 0; i < count; ++i) {
    const auto address = reinterpret_cast<uintptr_t>(frames[i]);
    if (n == 0 && address >= selfStart_ && address < selfEnd_) continue;  // the shim's own
    addresses[n++] = address;
  }
  if (n == 0) return 0;
  uint64_t hash = 0xcbf29ce484222325ull;
  for (int i = 0; i < n; ++i) hash = (hash ^ addresses[i]) * 0x100000001b3ull;
  std::lock_guard lock(mutex_);
  auto found = ids_.find(hash);
  if (found != ids_.end()) return found->second;
  // First sight: the names, as dladdr finds them (a module and offset where it finds none).
  uint32_t names[kMaxFrames];
  for (int i = 0; i < n; ++i) {
    Dl_info info{};
    std::string name;
    if (dladdr(reinterpret_cast<const void*>(addresses[i]), &info) != 0) {
      if (info.dli_sname != nullptr) {
        name = info.dli_sname;
      } else if (info.dli_fname != nullptr) {
        const char* slash = std::strrchr(info.dli_fname, '/');
        char offset[32];
        std::snprintf(offset, sizeof offset, "+0x%llx",
                      static_cast<unsigned long long>(addresses[i] -
                                                      reinterpret_cast<uintptr_t>(info.dli_fbase)));
        name = std::string(slash ? slash + 1 : info.dli_fname) + offset;
      }
    }
    names[i] = name.empty() ? 0 : trace.internString(name);
  }
  const uint32_t id = trace.internStack({addresses, static_cast<size_t>(n)},
                                        {names, static_cast<size_t>(n)});
  ids_.emplace(hash, id);
  return id;
}

}  // namespace delta::shim
