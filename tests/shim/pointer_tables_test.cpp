// PointerTables: what the shim learns about tables of device pointers from the writes it sees.
#include "shim/pointer_tables.h"

#include <gtest/gtest.h>

#include <vector>

namespace delta::shim {
namespace {

using Entry = PointerTables::Entry;
using Range = PointerTables::Range;

constexpr uint64_t kTable = 0x10000;  // a 64-byte table
constexpr uint64_t kOther = 0x20000;
const Range kTableRange{kTable, 64};
const Range kOtherRange{kOther, 256};

std::vector<uint64_t> valuesAt(const PointerTables& tables, uint64_t address) {
  const PointerTables::Table* table = tables.tableContaining(address);
  return table ? table->values : std::vector<uint64_t>{};
}

TEST(PointerTables, AHostCopyMakesATableFoundByAnyAddressInIt) {
  PointerTables tables;
  const Entry found[] = {{kTable, 0xA00000}, {kTable + 8, 0xB00000}, {kTable + 16, 0xA00000}};
  tables.write(kTableRange, kTable, 24, found);
  EXPECT_EQ(valuesAt(tables, kTable), (std::vector<uint64_t>{0xA00000, 0xB00000}));
  EXPECT_EQ(valuesAt(tables, kTable + 63), (std::vector<uint64_t>{0xA00000, 0xB00000}));
  EXPECT_EQ(tables.tableContaining(kTable + 64), nullptr);
  EXPECT_EQ(tables.tableContaining(kTable - 1), nullptr);
  EXPECT_TRUE(tables.anyEntriesIn(kTable + 8, 1));
  EXPECT_FALSE(tables.anyEntriesIn(kTable + 24, 40));
}

TEST(PointerTables, WritingARangeAgainReplacesOnlyThatRange) {
  PointerTables tables;
  const Entry first[] = {{kTable, 0xA00000}, {kTable + 8, 0xB00000}};
  tables.write(kTableRange, kTable, 16, first);
  const Entry second[] = {{kTable + 8, 0xC00000}};
  tables.write(kTableRange, kTable + 8, 8, second);
  EXPECT_EQ(valuesAt(tables, kTable), (std::vector<uint64_t>{0xA00000, 0xC00000}));
  // Data written over the first word: its pointer is gone.
  tables.write(kTableRange, kTable, 8, {});
  EXPECT_EQ(valuesAt(tables, kTable), (std::vector<uint64_t>{0xC00000}));
  // A write of one byte spoils the word it lands in.
  tables.write(kTableRange, kTable + 12, 1, {});
  EXPECT_EQ(tables.tableContaining(kTable), nullptr);
  EXPECT_TRUE(tables.empty());
}

TEST(PointerTables, ADeviceCopyCarriesTheEntriesOfItsWholeWordsOnly) {
  PointerTables tables;
  const Entry found[] = {{kTable, 0xA00000}, {kTable + 8, 0xB00000}, {kTable + 16, 0xC00000}};
  tables.write(kTableRange, kTable, 24, found);
  // Bytes 8..20 of the table to offset 32 of the other allocation: one whole word, one partial.
  tables.copy(kTable + 8, kOtherRange, kOther + 32, 12);
  const PointerTables::Table* copied = tables.tableContaining(kOther);
  ASSERT_NE(copied, nullptr);
  ASSERT_EQ(copied->entries.size(), 1u);
  EXPECT_EQ(copied->entries[0].at, kOther + 32);
  EXPECT_EQ(copied->entries[0].value, 0xB00000u);
  EXPECT_EQ(copied->range.base, kOther);
  EXPECT_EQ(copied->range.bytes, 256u);
  // The source is unchanged.
  EXPECT_EQ(valuesAt(tables, kTable).size(), 3u);
  // Copying words without pointers over it clears the destination.
  tables.copy(kTable + 32, kOtherRange, kOther + 32, 8);
  EXPECT_EQ(tables.tableContaining(kOther), nullptr);
}

TEST(PointerTables, ACopyWithinOneTableMovesWhatItHeldBefore) {
  PointerTables tables;
  const Entry found[] = {{kTable, 0xA00000}, {kTable + 8, 0xB00000}};
  tables.write(kTableRange, kTable, 16, found);
  tables.copy(kTable, kTableRange, kTable + 8, 16);  // overlapping, like memmove
  const PointerTables::Table* table = tables.tableContaining(kTable);
  ASSERT_NE(table, nullptr);
  ASSERT_EQ(table->entries.size(), 3u);
  EXPECT_EQ(table->entries[1].value, 0xA00000u);
  EXPECT_EQ(table->entries[2].value, 0xB00000u);
}

TEST(PointerTables, MemsetAndEraseForget) {
  PointerTables tables;
  const Entry found[] = {{kTable, 0xA00000}, {kTable + 8, 0xB00000}};
  tables.write(kTableRange, kTable, 16, found);
  tables.clear(kTable + 8, 8);
  EXPECT_EQ(valuesAt(tables, kTable), (std::vector<uint64_t>{0xA00000}));
  const Entry other[] = {{kOther, 0xC00000}};
  tables.write(kOtherRange, kOther, 8, other);
  tables.erase(kTable);
  EXPECT_EQ(tables.tableContaining(kTable), nullptr);
  EXPECT_NE(tables.tableContaining(kOther), nullptr);
  EXPECT_EQ(tables.size(), 1u);
}

TEST(PointerTables, UnmanagedAllocationsGiveExtentsAndTakeTheirTablesWithThem) {
  PointerTables tables;
  tables.addAllocation(kTable, 64);
  tables.addAllocation(kOther, 256);
  EXPECT_EQ(tables.allocationContaining(kOther + 255).base, kOther);
  EXPECT_FALSE(tables.allocationContaining(kOther + 256).valid());
  EXPECT_FALSE(tables.allocationContaining(0x1).valid());
  const Entry found[] = {{kTable + 8, 0xA00000}};
  tables.write(tables.allocationContaining(kTable + 8), kTable + 8, 8, found);
  EXPECT_EQ(tables.tableContaining(kTable)->range.bytes, 64u);
  EXPECT_TRUE(tables.removeAllocation(kTable));
  EXPECT_TRUE(tables.empty());
  EXPECT_FALSE(tables.allocationContaining(kTable).valid());
  EXPECT_FALSE(tables.removeAllocation(kTable));
  EXPECT_EQ(tables.allocationCount(), 1u);
}

TEST(PointerTables, AWriteWhoseExtentIsUnknownMakesATableOfTheWrittenRange) {
  PointerTables tables;
  const Entry found[] = {{kTable + 8, 0xA00000}};
  tables.write(Range{}, kTable + 8, 16, found);
  const PointerTables::Table* table = tables.tableContaining(kTable + 8);
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table->range.base, kTable + 8);
  EXPECT_EQ(table->range.bytes, 16u);
  EXPECT_EQ(tables.tableContaining(kTable), nullptr);
}

}  // namespace
}  // namespace delta::shim
