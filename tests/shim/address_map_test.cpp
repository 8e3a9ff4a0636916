// Table-driven tests of AddressMap (shim/address_map.h): which managed buffer an address
// falls in, at every boundary that matters (start, interior, last byte, one past the end,
// before the first range, after the last, in the gaps between ranges), after erases (the
// map keeps its low/high quick-reject span when ranges go, so the lookup behind it must
// still answer kNone), and which buffers a copy or memset range overlaps.
#include "shim/address_map.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace delta::shim {
namespace {

constexpr uint32_t kNone = AddressMap::kNone;

struct Range {
  uint64_t start;
  uint64_t bytes;
  uint32_t id;
};

// Three ranges with a gap before the second and none between the second and the third
// (adjacent ranges are the common case: the driver hands out consecutive reservations).
const std::vector<Range> kRanges = {
    {0x1000, 0x100, 1},  // [0x1000, 0x1100)
    {0x2000, 0x80, 2},   // [0x2000, 0x2080)
    {0x2080, 0x20, 3},   // [0x2080, 0x20a0), adjacent to 2
};

AddressMap build(const std::vector<Range>& ranges) {
  AddressMap map;
  for (const Range& r : ranges) map.insert(r.start, r.bytes, r.id);
  return map;
}

struct FindCase {
  const char* name;
  uint64_t address;
  uint32_t expected;
};

const FindCase kFindCases[] = {
    {"zero", 0, kNone},
    {"just before the first", 0xfff, kNone},
    {"first start", 0x1000, 1},
    {"first interior", 0x1080, 1},
    {"first end - 1", 0x10ff, 1},
    {"first end", 0x1100, kNone},
    {"gap between first and second", 0x1800, kNone},
    {"just before the second", 0x1fff, kNone},
    {"second start", 0x2000, 2},
    {"second end - 1", 0x207f, 2},
    {"second end is the third's start", 0x2080, 3},
    {"third end - 1", 0x209f, 3},
    {"third end", 0x20a0, kNone},
    {"after the last", 0x3000, kNone},
    {"highest address", UINT64_MAX, kNone},
};

TEST(AddressMapFind, Boundaries) {
  const AddressMap map = build(kRanges);
  EXPECT_EQ(map.size(), kRanges.size());
  for (const FindCase& c : kFindCases)
    EXPECT_EQ(map.find(c.address), c.expected) << c.name << " (0x" << std::hex << c.address << ")";
}

TEST(AddressMapFind, EmptyMapFindsNothing) {
  const AddressMap map;
  EXPECT_EQ(map.size(), 0u);
  for (const FindCase& c : kFindCases) EXPECT_EQ(map.find(c.address), kNone) << c.name;
}

TEST(AddressMapFind, ReinsertAtSameStartReplaces) {
  AddressMap map = build(kRanges);
  map.insert(0x1000, 0x10, 7);  // the same start again: the newer buffer wins
  EXPECT_EQ(map.size(), kRanges.size());
  EXPECT_EQ(map.find(0x1000), 7u);
  EXPECT_EQ(map.find(0x100f), 7u);
  EXPECT_EQ(map.find(0x1010), kNone);
}

// After erasing, the quick-reject span [low, high) still covers the erased ranges (it only
// grows): the answer must come from the lookup behind it. Each case erases some starts and
// then checks addresses.
struct EraseCase {
  const char* name;
  std::vector<uint64_t> erased;
  std::vector<FindCase> finds;
};

const EraseCase kEraseCases[] = {
    {"lowest erased",
     {0x1000},
     {{"its start", 0x1000, kNone}, {"its end - 1", 0x10ff, kNone}, {"second", 0x2000, 2},
      {"third", 0x2080, 3}}},
    {"highest erased",
     {0x2080},
     {{"its start", 0x2080, kNone}, {"its end - 1", 0x209f, kNone}, {"second end - 1", 0x207f, 2},
      {"first", 0x1000, 1}}},
    {"middle erased",
     {0x2000},
     {{"its start", 0x2000, kNone}, {"its end - 1", 0x207f, kNone}, {"first end - 1", 0x10ff, 1},
      {"third", 0x2080, 3}}},
    {"all erased",
     {0x1000, 0x2000, 0x2080},
     {{"first", 0x1000, kNone}, {"second", 0x2000, kNone}, {"third", 0x209f, kNone}}},
    {"not a start: nothing happens",
     {0x1080, 0x5000},
     {{"first interior", 0x1080, 1}, {"second", 0x2000, 2}, {"third", 0x2080, 3}}},
};

TEST(AddressMapErase, FindAfterErase) {
  for (const EraseCase& c : kEraseCases) {
    AddressMap map = build(kRanges);
    size_t erasedRanges = 0;
    for (uint64_t start : c.erased) {
      erasedRanges += std::count_if(kRanges.begin(), kRanges.end(),
                                    [&](const Range& r) { return r.start == start; });
      map.erase(start);
    }
    EXPECT_EQ(map.size(), kRanges.size() - erasedRanges) << c.name;
    for (const FindCase& f : c.finds)
      EXPECT_EQ(map.find(f.address), f.expected) << c.name << ": " << f.name;
  }
}

TEST(AddressMapErase, ReinsertOutsideTheOldSpanAfterEmptying) {
  AddressMap map = build(kRanges);
  for (const Range& r : kRanges) map.erase(r.start);
  // The span must grow to take in new ranges on both sides of where the old ones were.
  map.insert(0x100, 0x10, 8);
  map.insert(0x9000, 0x10, 9);
  EXPECT_EQ(map.find(0x100), 8u);
  EXPECT_EQ(map.find(0x10f), 8u);
  EXPECT_EQ(map.find(0x9000), 9u);
  EXPECT_EQ(map.find(0x900f), 9u);
  EXPECT_EQ(map.find(0x9010), kNone);
  EXPECT_EQ(map.find(0x1000), kNone);  // inside the old span, nothing there now
}

struct OverlapCase {
  const char* name;
  uint64_t address;
  uint64_t bytes;
  std::vector<uint32_t> expected;  // in address order
};

const OverlapCase kOverlapCases[] = {
    {"zero bytes", 0x1000, 0, {}},
    {"entirely before", 0x0, 0x1000, {}},
    {"ends at the first's start", 0x800, 0x800, {}},
    {"last byte before plus first byte", 0xfff, 2, {1}},
    {"contained in the first", 0x1010, 0x10, {1}},
    {"exactly the first", 0x1000, 0x100, {1}},
    {"contains the first", 0x800, 0x1000, {1}},
    {"starts at the first's end", 0x1100, 0x100, {}},
    {"in the gap", 0x1100, 0xf00, {}},
    {"first's last byte to the gap", 0x10ff, 0x10, {1}},
    {"across the gap", 0x10ff, 0xf02, {1, 2}},
    {"exactly the second", 0x2000, 0x80, {2}},
    {"second's last byte and third's first", 0x207f, 2, {2, 3}},
    {"third's first byte only", 0x2080, 1, {3}},
    {"contains all", 0x0, 0x10000, {1, 2, 3}},
    {"interior of the second to past the end", 0x2040, 0x1000, {2, 3}},
    {"after the last", 0x20a0, 0x100, {}},
    {"near the top of the address space", UINT64_MAX - 0x10, 0x10, {}},
};

TEST(AddressMapOverlap, Ranges) {
  const AddressMap map = build(kRanges);
  for (const OverlapCase& c : kOverlapCases) {
    std::vector<uint32_t> seen;
    map.forEachOverlapping(c.address, c.bytes, [&](uint32_t id) { seen.push_back(id); });
    EXPECT_EQ(seen, c.expected) << c.name;
  }
}

TEST(AddressMapOverlap, AfterErase) {
  AddressMap map = build(kRanges);
  map.erase(0x2000);
  std::vector<uint32_t> seen;
  map.forEachOverlapping(0x0, 0x10000, [&](uint32_t id) { seen.push_back(id); });
  EXPECT_EQ(seen, (std::vector<uint32_t>{1, 3}));
  seen.clear();
  map.forEachOverlapping(0x2000, 0x80, [&](uint32_t id) { seen.push_back(id); });
  EXPECT_TRUE(seen.empty());
}

// Many equal-sized adjacent ranges, as a training job's buffers look: every start, last
// byte and end is checked, so that an off-by-one in the lookup shows up somewhere.
TEST(AddressMapFind, ManyAdjacentRanges) {
  constexpr uint64_t kBase = 0x7f0000000000;
  constexpr uint64_t kBytes = 2 << 20;
  constexpr uint32_t kCount = 1000;
  AddressMap map;
  for (uint32_t i = 0; i < kCount; ++i) map.insert(kBase + i * kBytes, kBytes, i);
  for (uint32_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(map.find(kBase + i * kBytes), i);
    ASSERT_EQ(map.find(kBase + i * kBytes + kBytes / 2), i);
    ASSERT_EQ(map.find(kBase + (i + 1) * kBytes - 1), i);
  }
  EXPECT_EQ(map.find(kBase - 1), kNone);
  EXPECT_EQ(map.find(kBase + kCount * kBytes), kNone);
  // Erase every other one: their addresses now miss, their neighbours still hit.
  for (uint32_t i = 0; i < kCount; i += 2) map.erase(kBase + i * kBytes);
  for (uint32_t i = 0; i < kCount; ++i)
    ASSERT_EQ(map.find(kBase + i * kBytes + 1), i % 2 ? i : kNone) << i;
}

}  // namespace
}  // namespace delta::shim
