// Tables of device pointers: see pointer_tables.h.
#include "shim/pointer_tables.h"

#include <algorithm>

namespace delta::shim {

void PointerTables::addAllocation(uint64_t base, uint64_t bytes) {
  if (bytes == 0) return;
  allocations_[base] = bytes;
  allocationsLow_ = std::min(allocationsLow_, base);
  allocationsHigh_ = std::max(allocationsHigh_, base + bytes);
}

bool PointerTables::removeAllocation(uint64_t base) {
  erase(base);
  if (allocations_.erase(base) == 0) return false;
  if (allocations_.empty()) {
    allocationsLow_ = UINT64_MAX;
    allocationsHigh_ = 0;
  }
  return true;
}

PointerTables::Range PointerTables::allocationContaining(uint64_t address) const {
  if (address < allocationsLow_ || address >= allocationsHigh_) return {};
  auto it = allocations_.upper_bound(address);
  if (it == allocations_.begin()) return {};
  --it;
  const Range range{it->first, it->second};
  return range.contains(address) ? range : Range{};
}

bool PointerTables::anyEntriesIn(uint64_t at, uint64_t bytes) const {
  if (bytes == 0 || at >= high_ || at + bytes <= low_) return false;
  auto it = tables_.upper_bound(at);
  if (it != tables_.begin()) --it;
  // A word that starts up to 7 bytes before `at` overlaps the range too.
  const uint64_t from = at >= 7 ? at - 7 : 0;
  for (; it != tables_.end() && it->first < at + bytes; ++it) {
    const std::vector<Entry>& entries = it->second.entries;
    auto first = std::lower_bound(entries.begin(), entries.end(), from,
                                  [](const Entry& e, uint64_t a) { return e.at < a; });
    if (first != entries.end() && first->at < at + bytes) return true;
  }
  return false;
}

std::map<uint64_t, PointerTables::Table>::iterator PointerTables::tableFor(Range range) {
  auto it = tables_.upper_bound(range.base);
  if (it != tables_.begin()) {
    auto before = std::prev(it);
    if (before->second.range.contains(range.base)) it = before;
    else it = tables_.end();
  } else {
    it = tables_.end();
  }
  if (it == tables_.end()) {
    it = tables_.emplace(range.base, Table{range, {}, {}}).first;
  } else if (range.base + range.bytes > it->second.range.base + it->second.range.bytes) {
    it->second.range.bytes = range.base + range.bytes - it->second.range.base;
  }
  return it;
}

void PointerTables::write(Range range, uint64_t at, uint64_t bytes, std::span<const Entry> found) {
  if (bytes == 0) return;
  // The words written must lie in the table's range, whatever the caller could find out.
  if (!range.valid() || at < range.base) range = Range{at, bytes};
  if (at + bytes > range.base + range.bytes) range.bytes = at + bytes - range.base;
  if (found.empty()) {
    // Nothing to remember: only what the words held before goes.
    clear(at, bytes);
    return;
  }
  replace(tableFor(range), at, bytes, found);
  refreshSpan();
}

void PointerTables::copy(uint64_t source, Range destinationRange, uint64_t destination,
                         uint64_t bytes) {
  if (bytes == 0) return;
  std::vector<Entry> moved;
  if (source < high_ && source + bytes > low_) {
    auto it = tables_.upper_bound(source);
    if (it != tables_.begin()) --it;
    for (; it != tables_.end() && it->first < source + bytes; ++it)
      for (const Entry& e : it->second.entries)
        if (e.at >= source && e.at + 8 <= source + bytes)
          moved.push_back(Entry{destination + (e.at - source), e.value});
  }
  // Source and destination may be one table: `moved` was taken before anything changed.
  write(destinationRange, destination, bytes, moved);
}

void PointerTables::clear(uint64_t at, uint64_t bytes) {
  if (!anyEntriesIn(at, bytes)) return;
  auto it = tables_.upper_bound(at);
  if (it != tables_.begin()) --it;
  while (it != tables_.end() && it->first < at + bytes) {
    auto next = std::next(it);
    replace(it, at, bytes, {});
    it = next;
  }
  refreshSpan();
}

void PointerTables::erase(uint64_t base) {
  if (tables_.erase(base) > 0) refreshSpan();
}

void PointerTables::replace(std::map<uint64_t, Table>::iterator table, uint64_t at, uint64_t bytes,
                            std::span<const Entry> found) {
  std::vector<Entry>& entries = table->second.entries;
  // A word is replaced when any of its bytes is written.
  const uint64_t from = at >= 7 ? at - 7 : 0;
  auto first = std::lower_bound(entries.begin(), entries.end(), from,
                                [](const Entry& e, uint64_t a) { return e.at < a; });
  auto last = std::lower_bound(first, entries.end(), at + bytes,
                               [](const Entry& e, uint64_t a) { return e.at < a; });
  const bool unchanged = static_cast<size_t>(last - first) == found.size() &&
                         std::equal(first, last, found.begin(), [](const Entry& a, const Entry& b) {
                           return a.at == b.at && a.value == b.value;
                         });
  if (unchanged) return;  // a table written again with the same pointers (the common case)
  first = entries.erase(first, last);
  entries.insert(first, found.begin(), found.end());
  if (entries.empty()) {
    tables_.erase(table);
    return;
  }
  refreshValues(table->second);
}

void PointerTables::refreshValues(Table& table) {
  table.values.clear();
  for (const Entry& e : table.entries) table.values.push_back(e.value);
  std::sort(table.values.begin(), table.values.end());
  table.values.erase(std::unique(table.values.begin(), table.values.end()), table.values.end());
}

void PointerTables::refreshSpan() {
  if (tables_.empty()) {
    low_ = UINT64_MAX;
    high_ = 0;
    return;
  }
  low_ = tables_.begin()->first;
  high_ = 0;
  for (const auto& [base, table] : tables_)
    high_ = std::max(high_, table.range.base + table.range.bytes);
}

}  // namespace delta::shim
