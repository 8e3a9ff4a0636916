// isCodeOrUnknownAddress: a launch's `func` that the runtime does not know is handed to the
// driver's cuKernel* calls only when it is data (a kernel handle), never code (a stub).
#include "shim/code_address.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdlib>
#include <memory>
#include <vector>

namespace delta::shim {
namespace {

int someFunction(int x) { return x + 1; }
int gSomeData = 7;

TEST(CodeAddress, FunctionsAreCode) {
  EXPECT_TRUE(isCodeOrUnknownAddress(reinterpret_cast<const void*>(&someFunction)));
  EXPECT_TRUE(isCodeOrUnknownAddress(reinterpret_cast<const void*>(&std::malloc)));  // libc
}

TEST(CodeAddress, HeapStackAndStaticDataAreNot) {
  auto small = std::make_unique<int>(3);
  std::vector<char> large(64 << 20);  // its own mapping
  int onStack = 0;
  EXPECT_FALSE(isCodeOrUnknownAddress(small.get()));
  EXPECT_FALSE(isCodeOrUnknownAddress(large.data() + (32 << 20)));
  EXPECT_FALSE(isCodeOrUnknownAddress(&onStack));
  EXPECT_FALSE(isCodeOrUnknownAddress(&gSomeData));
}

TEST(CodeAddress, UnmappedAddressesAreUnknown) {
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(page, MAP_FAILED);
  EXPECT_FALSE(isCodeOrUnknownAddress(page));
  munmap(page, 4096);
  EXPECT_TRUE(isCodeOrUnknownAddress(page));
  EXPECT_TRUE(isCodeOrUnknownAddress(nullptr));
}

// Many mappings (more than one read of /proc/self/maps holds): the last still found.
TEST(CodeAddress, FindsAMappingFarDownTheList) {
  std::vector<void*> pages;
  for (int i = 0; i < 400; ++i) {
    // Alternating protections keep the kernel from merging neighbours into one line.
    void* page = mmap(nullptr, 4096, i % 2 ? PROT_READ : PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(page, MAP_FAILED);
    pages.push_back(page);
  }
  for (void* page : pages) EXPECT_FALSE(isCodeOrUnknownAddress(page));
  for (void* page : pages) munmap(page, 4096);
}

}  // namespace
}  // namespace delta::shim
