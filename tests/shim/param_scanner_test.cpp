// Tests of the launch-parameter scanner (shim/param_scanner.{h,cpp}): which 8-byte values
// of a launch's parameters scanParams offers as candidate device pointers, in both forms a
// launch may pass them (kernelParams, one pointer per parameter; or the packed `extra`
// buffer), with the layout known or not; and how ParamLayoutCache builds and keeps a
// kernel's layout from cuFuncGetParamInfo (here a fake of our own in a DriverApi).
#include "shim/param_scanner.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace delta::shim {
namespace {

using Bytes = std::vector<unsigned char>;

template <class T>
Bytes raw(const T& value) {
  Bytes bytes(sizeof value);
  std::memcpy(bytes.data(), &value, sizeof value);
  return bytes;
}

// By-value structs as kernels take them. Padding is zero because every parameter's bytes
// start zeroed (value-initialised), so the words the scanner reads are predictable.
struct S16 {  // pointer at offset 8 behind a 4-byte member and padding
  uint32_t count;
  uint64_t pointer;
};
struct S24 {  // pointers at offsets 8 and 16
  uint64_t count;
  uint64_t first;
  uint64_t second;
};
struct S12 {  // 12 bytes, 4-byte aligned: one full 8-byte word, then 4 bytes that are not read
  uint32_t a, b, c;
};
static_assert(sizeof(S16) == 16 && offsetof(S16, pointer) == 8);
static_assert(sizeof(S24) == 24);
static_assert(sizeof(S12) == 12 && alignof(S12) == 4);

Bytes u32(uint32_t v) { return raw(v); }
Bytes ptr(uint64_t v) { return raw(v); }
Bytes s16(uint32_t count, uint64_t pointer) {
  S16 s{};
  std::memset(&s, 0, sizeof s);
  s.count = count;
  s.pointer = pointer;
  return raw(s);
}
Bytes s24(uint64_t count, uint64_t first, uint64_t second) { return raw(S24{count, first, second}); }
Bytes s12(uint32_t a, uint32_t b, uint32_t c) { return raw(S12{a, b, c}); }

constexpr uint64_t kA = 0x7f0000200000;
constexpr uint64_t kB = 0x7f0000400010;  // interior pointers are candidates like any other
constexpr uint64_t kC = 0x7f00006fffff;
uint64_t word(uint32_t low, uint32_t high) { return uint64_t(high) << 32 | low; }

// The packed layout the driver reports (as cudasim lays it out): each parameter at the next
// offset aligned to the largest power of two dividing its size, capped at 8.
ParamLayout packedLayout(const std::vector<Bytes>& params) {
  ParamLayout layout;
  layout.known = true;
  uint32_t offset = 0;
  for (const Bytes& p : params) {
    uint32_t size = static_cast<uint32_t>(p.size());
    uint32_t align = 1;
    while (align < 8 && size % (align * 2) == 0) align *= 2;
    offset = (offset + align - 1) / align * align;
    layout.offsets.push_back(offset);
    layout.sizes.push_back(size);
    offset += size;
  }
  return layout;
}

Bytes packedBuffer(const std::vector<Bytes>& params, const ParamLayout& layout) {
  size_t end = 0;
  for (size_t i = 0; i < params.size(); ++i)
    end = std::max<size_t>(end, layout.offsets[i] + layout.sizes[i]);
  Bytes buffer((end + 7) / 8 * 8, 0);  // the padding at the end, as a compiler would leave it
  for (size_t i = 0; i < params.size(); ++i)
    std::memcpy(buffer.data() + layout.offsets[i], params[i].data(), params[i].size());
  return buffer;
}

struct ScanResult {
  bool ok = false;
  std::vector<uint64_t> values;
};

ScanResult scan(const ParamLayout& layout, void** kernelParams, void** extra) {
  ScanResult result;
  result.ok = scanParams(layout, kernelParams, extra,
                         [&](uint64_t value) { result.values.push_back(value); });
  return result;
}

struct ScanCase {
  const char* name;
  std::vector<Bytes> params;
  // What the scanner offers when it knows the layout (kernelParams, or `extra` with the
  // layout): each parameter's own 8-byte words.
  std::vector<uint64_t> perParameter;
  // What it offers from the packed buffer alone: the buffer's 8-byte words.
  std::vector<uint64_t> packedWords;
};

const std::vector<ScanCase>& scanCases() {
  static const std::vector<ScanCase> cases = {
      {"one pointer", {ptr(kA)}, {kA}, {kA}},
      {"4-byte ints and pointers",  // offsets 0, 8, 16, 24
       {u32(7), ptr(kA), u32(9), ptr(kB)},
       {kA, kB},
       {7, kA, 9, kB}},
      {"two ints share a packed word",  // offsets 0, 4, 8
       {u32(1), u32(2), ptr(kA)},
       {kA},
       {word(1, 2), kA}},
      {"16- and 24-byte structs with pointers at 8-byte offsets",  // offsets 0, 16
       {s16(3, kA), s24(5, kB, kC)},
       {3, kA, 5, kB, kC},
       {3, kA, 5, kB, kC}},
      {"12-byte struct: its last 4 bytes are not a word",  // offsets 0, 16
       {s12(2, 3, 4), ptr(kA)},
       {word(2, 3), kA},
       {word(2, 3), word(4, 0), kA}},
      {"12-byte struct after an int",  // offsets 0, 4, 16
       {u32(1), s12(2, 3, 4), ptr(kA)},
       {word(2, 3), kA},
       {word(1, 2), word(3, 4), kA}},
      {"eight pointers",
       {ptr(kA), ptr(kB), ptr(kC), ptr(kA + 8), ptr(kB + 8), ptr(kC - 8), ptr(0), ptr(~0ull)},
       {kA, kB, kC, kA + 8, kB + 8, kC - 8, 0, ~0ull},
       {kA, kB, kC, kA + 8, kB + 8, kC - 8, 0, ~0ull}},
      {"only ints", {u32(1), u32(2), u32(3)}, {}, {word(1, 2), word(3, 0)}},
  };
  return cases;
}

TEST(ScanParams, KernelParamsWithKnownLayout) {
  for (const ScanCase& c : scanCases()) {
    std::vector<Bytes> storage = c.params;  // the launch's own copies of the values
    std::vector<void*> kernelParams;
    for (Bytes& p : storage) kernelParams.push_back(p.data());
    ScanResult r = scan(packedLayout(c.params), kernelParams.data(), nullptr);
    EXPECT_TRUE(r.ok) << c.name;
    EXPECT_EQ(r.values, c.perParameter) << c.name;
  }
}

TEST(ScanParams, KernelParamsWithUnknownLayoutCannotBeRead) {
  for (const ScanCase& c : scanCases()) {
    std::vector<Bytes> storage = c.params;
    std::vector<void*> kernelParams;
    for (Bytes& p : storage) kernelParams.push_back(p.data());
    ScanResult r = scan(ParamLayout{}, kernelParams.data(), nullptr);
    EXPECT_FALSE(r.ok) << c.name;
    EXPECT_TRUE(r.values.empty()) << c.name;
  }
}

TEST(ScanParams, PackedExtraWithKnownLayout) {
  for (const ScanCase& c : scanCases()) {
    const ParamLayout layout = packedLayout(c.params);
    Bytes buffer = packedBuffer(c.params, layout);
    size_t size = buffer.size();
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer.data(), CU_LAUNCH_PARAM_BUFFER_SIZE,
                     &size, CU_LAUNCH_PARAM_END};
    ScanResult r = scan(layout, nullptr, extra);
    EXPECT_TRUE(r.ok) << c.name;
    EXPECT_EQ(r.values, c.perParameter) << c.name;
  }
}

TEST(ScanParams, PackedExtraWithUnknownLayoutReadsTheBuffer) {
  for (const ScanCase& c : scanCases()) {
    Bytes buffer = packedBuffer(c.params, packedLayout(c.params));
    size_t size = buffer.size();
    // Size first this time: the order of the pairs is free.
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_BUFFER_POINTER,
                     buffer.data(), CU_LAUNCH_PARAM_END};
    ScanResult r = scan(ParamLayout{}, nullptr, extra);
    EXPECT_TRUE(r.ok) << c.name;
    EXPECT_EQ(r.values, c.packedWords) << c.name;
  }
}

TEST(ScanParams, PackedExtraNeverReadsPastTheStatedSize) {
  // Parameters at offsets 0, 8, 16; the launch states 16 bytes (a short buffer).
  const std::vector<Bytes> params = {ptr(kA), ptr(kB), ptr(kC)};
  const ParamLayout layout = packedLayout(params);
  Bytes buffer = packedBuffer(params, layout);
  size_t size = 16;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer.data(), CU_LAUNCH_PARAM_BUFFER_SIZE,
                   &size, CU_LAUNCH_PARAM_END};
  ScanResult known = scan(layout, nullptr, extra);
  EXPECT_TRUE(known.ok);
  EXPECT_EQ(known.values, (std::vector<uint64_t>{kA, kB}));
  ScanResult unknown = scan(ParamLayout{}, nullptr, extra);
  EXPECT_TRUE(unknown.ok);
  EXPECT_EQ(unknown.values, (std::vector<uint64_t>{kA, kB}));
  // A size that is not a multiple of 8: the tail shorter than a word is not read.
  size = 20;
  ScanResult tail = scan(ParamLayout{}, nullptr, extra);
  EXPECT_EQ(tail.values, (std::vector<uint64_t>{kA, kB}));
}

TEST(ScanParams, ZeroParameterKernels) {
  const ParamLayout unknown;
  ParamLayout none;
  none.known = true;  // the driver said: no parameters
  void* emptyParams[1] = {nullptr};
  struct Case {
    const char* name;
    const ParamLayout& layout;
    void** kernelParams;
    bool ok;
  };
  const Case cases[] = {
      {"known, no params at all", none, nullptr, true},
      {"known, an empty kernelParams array", none, emptyParams, true},
      {"unknown, no params at all", unknown, nullptr, false},
  };
  for (const Case& c : cases) {
    ScanResult r = scan(c.layout, c.kernelParams, nullptr);
    EXPECT_EQ(r.ok, c.ok) << c.name;
    EXPECT_TRUE(r.values.empty()) << c.name;
  }
}

TEST(ScanParams, MalformedExtra) {
  uint64_t buffer[2] = {kA, kB};
  size_t size = sizeof buffer;
  void* const kUnknownKey = reinterpret_cast<void*>(0x3);
  struct Case {
    const char* name;
    std::vector<void*> extra;  // CU_LAUNCH_PARAM_END is appended
    bool ok;
    std::vector<uint64_t> values;
  };
  const Case cases[] = {
      {"END only", {}, false, {}},
      {"size without a pointer", {CU_LAUNCH_PARAM_BUFFER_SIZE, &size}, false, {}},
      {"unknown key before the buffer",
       {kUnknownKey, nullptr, CU_LAUNCH_PARAM_BUFFER_POINTER, buffer, CU_LAUNCH_PARAM_BUFFER_SIZE,
        &size},
       false, {}},
      {"unknown key after the buffer",
       {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, kUnknownKey,
        nullptr},
       false, {}},
      {"null buffer pointer",
       {CU_LAUNCH_PARAM_BUFFER_POINTER, nullptr, CU_LAUNCH_PARAM_BUFFER_SIZE, &size}, false, {}},
      // The driver refuses such a launch; the scanner must only not read the buffer.
      {"pointer without a size", {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer}, true, {}},
  };
  for (const Case& c : cases) {
    std::vector<void*> extra = c.extra;
    extra.push_back(CU_LAUNCH_PARAM_END);
    for (bool known : {false, true}) {
      ParamLayout layout;
      if (known) layout = packedLayout({ptr(0), ptr(0)});
      ScanResult r = scan(layout, nullptr, extra.data());
      EXPECT_EQ(r.ok, c.ok) << c.name << (known ? " (known layout)" : " (unknown layout)");
      EXPECT_EQ(r.values, c.values) << c.name << (known ? " (known layout)" : " (unknown layout)");
    }
  }
}

TEST(ScanParams, KernelParamsWinOverExtra) {
  // The driver rejects a launch with both; the scanner reads kernelParams and nothing else.
  uint64_t value = kA;
  void* kernelParams[] = {&value};
  uint64_t buffer = kB;
  size_t size = sizeof buffer;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &buffer, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  ScanResult r = scan(packedLayout({ptr(0)}), kernelParams, extra);
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.values, (std::vector<uint64_t>{kA}));
}

// ---- ParamLayoutCache over a fake cuFuncGetParamInfo ---------------------------------------

struct FakeKernel {
  std::vector<std::pair<size_t, size_t>> params;  // offset, size
  CUresult failure = CUDA_SUCCESS;  // returned at index `failAt` instead of a parameter
  size_t failAt = 0;
  bool endless = false;  // a broken driver that describes parameters forever
};

std::map<CUfunction, FakeKernel> gKernels;
std::map<CUfunction, int> gCalls;

CUresult describe(CUfunction function, size_t index, size_t* offset, size_t* size) {
  auto it = gKernels.find(function);
  if (it == gKernels.end()) return CUDA_ERROR_INVALID_HANDLE;
  const FakeKernel& k = it->second;
  if (k.endless) {
    *offset = index * 8;
    *size = 8;
    return CUDA_SUCCESS;
  }
  if (k.failure != CUDA_SUCCESS && index == k.failAt) return k.failure;
  if (index >= k.params.size()) return CUDA_ERROR_INVALID_VALUE;  // past the last one
  *offset = k.params[index].first;
  *size = k.params[index].second;
  return CUDA_SUCCESS;
}

CUresult fakeParamInfo(CUfunction function, size_t index, size_t* offset, size_t* size) {
  gCalls[function]++;
  return describe(function, index, offset, size);
}

// A kernel handle is described by cuKernelGetParamInfo, from the same table: the fake keys
// both kinds by address, and counts which call was asked.
std::map<const void*, int> gKernelCalls;

CUresult fakeKernelParamInfo(CUkernel kernel, size_t index, size_t* offset, size_t* size) {
  gKernelCalls[kernel]++;
  return describe(reinterpret_cast<CUfunction>(kernel), index, offset, size);
}

CUfunction fn(uintptr_t id) { return reinterpret_cast<CUfunction>(id); }
CUkernel kernelHandle(uintptr_t id) { return reinterpret_cast<CUkernel>(id); }

class ParamLayoutCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gKernels.clear();
    gCalls.clear();
    gKernelCalls.clear();
    // The only entries the cache calls (the names, only for a verbose line on failure).
    api_.cuFuncGetParamInfo = &fakeParamInfo;
    api_.cuKernelGetParamInfo = &fakeKernelParamInfo;
  }
  DriverApi api_;
  ParamLayoutCache cache_;
};

TEST_F(ParamLayoutCacheTest, Layouts) {
  struct Case {
    const char* name;
    FakeKernel kernel;
    bool known;
    std::vector<uint32_t> offsets, sizes;
  };
  const Case cases[] = {
      {"mixed sizes", {{{0, 4}, {8, 8}, {16, 16}, {32, 24}, {56, 12}}}, true,
       {0, 8, 16, 32, 56}, {4, 8, 16, 24, 12}},
      {"no parameters", {}, true, {}, {}},
      {"the driver cannot describe it", {{{0, 8}}, CUDA_ERROR_NOT_SUPPORTED, 0}, false, {}, {}},
      {"fails after two parameters", {{{0, 8}, {8, 8}, {16, 8}}, CUDA_ERROR_INVALID_HANDLE, 2},
       false, {}, {}},
      {"never ends", {{}, CUDA_SUCCESS, 0, true}, false, {}, {}},
  };
  uintptr_t id = 0x100;
  for (const Case& c : cases) {
    const CUfunction f = fn(id += 0x10);
    gKernels[f] = c.kernel;
    const ParamLayout& layout = cache_.layout(api_, LaunchTarget::function(f));
    EXPECT_EQ(layout.known, c.known) << c.name;
    EXPECT_EQ(layout.offsets, c.offsets) << c.name;
    EXPECT_EQ(layout.sizes, c.sizes) << c.name;
  }
}

// CUDA 13's <<<>>> launches name a kernel handle, which the driver describes through
// cuKernelGetParamInfo; handing it to cuFuncGetParamInfo is not what the driver documents.
TEST_F(ParamLayoutCacheTest, AKernelHandleIsDescribedByTheKernelCall) {
  gKernels[fn(0x5000)] = FakeKernel{{{0, 8}, {8, 4}, {16, 8}}};
  const ParamLayout& layout = cache_.layout(api_, LaunchTarget::kernel(kernelHandle(0x5000)));
  EXPECT_TRUE(layout.known);
  EXPECT_EQ(layout.offsets, (std::vector<uint32_t>{0, 8, 16}));
  EXPECT_EQ(layout.sizes, (std::vector<uint32_t>{8, 4, 8}));
  EXPECT_EQ(gKernelCalls[kernelHandle(0x5000)], 4);  // three parameters, then past the last
  EXPECT_TRUE(gCalls.empty()) << "only through cuKernelGetParamInfo";
  // Asked again, from the cache.
  EXPECT_EQ(&cache_.layout(api_, LaunchTarget::kernel(kernelHandle(0x5000))), &layout);
  EXPECT_EQ(gKernelCalls[kernelHandle(0x5000)], 4);

  gKernels[fn(0x6000)] = FakeKernel{{{0, 8}}, CUDA_ERROR_INVALID_HANDLE, 0};
  EXPECT_FALSE(cache_.layout(api_, LaunchTarget::kernel(kernelHandle(0x6000))).known);
}

TEST_F(ParamLayoutCacheTest, AsksTheDriverOncePerFunction) {
  const CUfunction a = fn(0x1000), b = fn(0x2000), broken = fn(0x3000);
  gKernels[a] = FakeKernel{{{0, 8}, {8, 4}}};
  gKernels[b] = FakeKernel{{{0, 16}}};
  gKernels[broken] = FakeKernel{{}, CUDA_ERROR_NOT_SUPPORTED, 0};
  const ParamLayout& first = cache_.layout(api_, LaunchTarget::function(a));
  EXPECT_EQ(gCalls[a], 3);  // two parameters, then CUDA_ERROR_INVALID_VALUE
  EXPECT_EQ(&cache_.layout(api_, LaunchTarget::function(b)),
            &cache_.layout(api_, LaunchTarget::function(b)));
  // The same entry, still there.
  EXPECT_EQ(&cache_.layout(api_, LaunchTarget::function(a)), &first);
  EXPECT_EQ(gCalls[a], 3);
  EXPECT_EQ(gCalls[b], 2);
  // An unknown layout is remembered too: the driver is not asked again on every launch.
  EXPECT_FALSE(cache_.layout(api_, LaunchTarget::function(broken)).known);
  EXPECT_FALSE(cache_.layout(api_, LaunchTarget::function(broken)).known);
  EXPECT_EQ(gCalls[broken], 1);
  EXPECT_EQ(first.sizes, (std::vector<uint32_t>{8, 4}));
}

// A layout from the cache drives the scan of a real launch's kernelParams.
TEST_F(ParamLayoutCacheTest, CachedLayoutScansLaunch) {
  const CUfunction f = fn(0x4000);
  gKernels[f] = FakeKernel{{{0, 4}, {8, 8}, {16, 16}}};
  uint32_t n = 42;
  uint64_t p = kA;
  S16 s{};
  std::memset(&s, 0, sizeof s);
  s.count = 1;
  s.pointer = kB;
  void* kernelParams[] = {&n, &p, &s};
  ScanResult r = scan(cache_.layout(api_, LaunchTarget::function(f)), kernelParams, nullptr);
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.values, (std::vector<uint64_t>{kA, 1, kB}));
}

}  // namespace
}  // namespace delta::shim
