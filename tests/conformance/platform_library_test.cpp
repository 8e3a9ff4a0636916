/* Which libraries this binary really runs on (the real libcudart/libcupti are in the
 * linker cache), cuGetProcAddress answering for every driver function the platform
 * exports, cudasim's VMM granularity, and the runtime without any libcuda.so.1. */
#include <cupti.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "conformance_util.h"

#ifndef CUDASIM_LIB_DIR
#error "CUDASIM_LIB_DIR must name the build's tests/cudasim directory"
#endif

namespace conformance {
namespace {

std::string RealDir(const std::string& file) {
  char buf[PATH_MAX];
  if (realpath(file.c_str(), buf) == nullptr) return "realpath failed: " + file;
  return std::filesystem::path(buf).parent_path().string();
}

std::string LibraryOf(const void* symbol) {
  Dl_info info{};
  if (dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

std::string ExpectedDir() {
  char buf[PATH_MAX];
  if (realpath(CUDASIM_LIB_DIR, buf) == nullptr) return CUDASIM_LIB_DIR;
  return buf;
}

TEST(PlatformLibraries, DriverRuntimeAndCuptiComeFromTheBuild) {
  std::string driver = LibraryOf(reinterpret_cast<const void*>(&cuInit));
  std::string runtime = LibraryOf(reinterpret_cast<const void*>(&cudaMalloc));
  std::string cupti = LibraryOf(reinterpret_cast<const void*>(&cuptiSubscribe));
  EXPECT_EQ(RealDir(driver), ExpectedDir()) << driver;
  EXPECT_EQ(RealDir(runtime), ExpectedDir()) << runtime;
  EXPECT_EQ(RealDir(cupti), ExpectedDir()) << cupti;
  EXPECT_NE(driver.find("libcuda.so"), std::string::npos) << driver;
  EXPECT_NE(runtime.find("libcudart.so"), std::string::npos) << runtime;
  EXPECT_NE(cupti.find("libcupti.so"), std::string::npos) << cupti;
}

TEST(PlatformLibraries, RuntimeDlopenOfLibcudaFindsTheSameDriver) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(h, nullptr) << "libcuda.so.1 is not loaded";
  void* sym = dlsym(h, "cuInit");
  EXPECT_EQ(sym, reinterpret_cast<void*>(&cuInit));
  dlclose(h);
}

// Names of the functions the loaded libcuda.so.1 exports (its .dynsym).
std::set<std::string> ExportedDriverFunctions(const std::string& path) {
  std::set<std::string> names;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return names;
  struct stat st {};
  fstat(fd, &st);
  void* map = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return names;
  const auto* base = static_cast<const unsigned char*>(map);
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(base);
  const auto* sh = reinterpret_cast<const Elf64_Shdr*>(base + eh->e_shoff);
  for (int i = 0; i < eh->e_shnum; ++i) {
    if (sh[i].sh_type != SHT_DYNSYM) continue;
    const auto* syms = reinterpret_cast<const Elf64_Sym*>(base + sh[i].sh_offset);
    const char* strtab = reinterpret_cast<const char*>(base + sh[sh[i].sh_link].sh_offset);
    size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
    for (size_t k = 0; k < n; ++k) {
      if (ELF64_ST_TYPE(syms[k].st_info) != STT_FUNC || syms[k].st_shndx == SHN_UNDEF) continue;
      if (ELF64_ST_BIND(syms[k].st_info) == STB_LOCAL) continue;
      std::string name = strtab + syms[k].st_name;
      if (name.size() > 2 && name[0] == 'c' && name[1] == 'u' && std::isupper(name[2]))
        names.insert(name);
    }
  }
  munmap(map, static_cast<size_t>(st.st_size));
  return names;
}

TEST(PlatformLibraries, GetProcAddressAnswersForEveryExportedDriverFunction) {
  ASSERT_CU(cuInit(0));
  std::string driver = LibraryOf(reinterpret_cast<const void*>(&cuInit));
  auto names = ExportedDriverFunctions(driver);
  ASSERT_GT(names.size(), 50u) << "could not read the exports of " << driver;
  for (const std::string& name : names) {
    std::string base = name;
    bool per_thread = false;
    for (const char* suffix : {"_ptsz", "_ptds"}) {
      if (base.size() > 5 && base.compare(base.size() - 5, 5, suffix) == 0) {
        base.resize(base.size() - 5);
        per_thread = true;
      }
    }
    // strip a _vN version suffix
    auto v = base.rfind("_v");
    if (v != std::string::npos && v + 2 < base.size() &&
        base.find_first_not_of("0123456789", v + 2) == std::string::npos)
      base.resize(v);
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = cuGetProcAddress(base.c_str(), &fn, 13000,
                                  per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                             : CU_GET_PROC_ADDRESS_LEGACY_STREAM,
                                  &status);
    EXPECT_EQ(r, CUDA_SUCCESS) << name << " as " << base;
    EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS) << name << " as " << base;
    EXPECT_NE(fn, nullptr) << name << " as " << base;
  }
}

TEST(PlatformLibraries, GetProcAddressReturnsTheExportedVersionedFunction) {
  ASSERT_CU(cuInit(0));
  struct Case {
    const char* base;
    cuuint64_t flags;
    const char* exported;
  } cases[] = {
      {"cuMemAlloc", CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuMemAlloc_v2"},
      {"cuMemFree", CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuMemFree_v2"},
      {"cuMemGetInfo", CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuMemGetInfo_v2"},
      {"cuMemcpyHtoDAsync", CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuMemcpyHtoDAsync_v2"},
      {"cuMemcpyHtoDAsync", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
       "cuMemcpyHtoDAsync_v2_ptsz"},
      {"cuMemcpyHtoD", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemcpyHtoD_v2_ptds"},
      {"cuLaunchKernel", CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuLaunchKernel"},
      {"cuLaunchKernel", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuLaunchKernel_ptsz"},
      {"cuEventElapsedTime", CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuEventElapsedTime_v2"},
      {"cuGetProcAddress", CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuGetProcAddress_v2"},
  };
  for (const Case& c : cases) {
    void* fn = nullptr;
    ASSERT_CU(cuGetProcAddress(c.base, &fn, 13000, c.flags, nullptr)) << c.base;
    void* exported = dlsym(RTLD_DEFAULT, c.exported);
    EXPECT_NE(exported, nullptr) << c.exported << " is not exported";
    EXPECT_EQ(fn, exported) << c.base << " should resolve to " << c.exported;
  }
}

TEST(PlatformLibraries, VmmGranularityIsTwoMiB) {
  ASSERT_CU(cuInit(0));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t min = 0, rec = 0;
  ASSERT_CU(cuMemGetAllocationGranularity(&min, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  ASSERT_CU(cuMemGetAllocationGranularity(&rec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  EXPECT_EQ(min, 2u << 20);
  EXPECT_EQ(rec, 2u << 20);
}

#ifdef CONFORMANCE_NODRIVER_PROBE
// The runtime alone, copied where no libcuda.so.1 is, loaded by a probe that links no CUDA
// library: every call must say cudaErrorInsufficientDriver.
TEST(PlatformLibraries, RuntimeWithoutAnyDriverIsInsufficientDriver) {
  std::string runtime = LibraryOf(reinterpret_cast<const void*>(&cudaMalloc));
  ASSERT_FALSE(runtime.empty());
  char tmpl[] = "/tmp/conformance-nodriver-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string copy = std::string(tmpl) + "/libcudart.so.13";
  std::filesystem::copy_file(runtime, copy);
  ChildOptions opt;
  opt.executable = CONFORMANCE_NODRIVER_PROBE;
  opt.args = {copy};
  opt.unset_env = {"LD_LIBRARY_PATH", "LD_PRELOAD", "CUDA_INJECTION64_PATH"};
  ChildResult r = RunChild("", opt);
  std::filesystem::remove_all(tmpl);
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
}
#endif

}  // namespace
}  // namespace conformance
