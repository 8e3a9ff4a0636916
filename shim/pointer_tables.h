// Tables of device pointers: where in device memory the program stored pointer values that lead
// to buffers the shim tracks, so that a kernel given the table (and not the buffers) still gets
// those buffers made resident.
//
// A table is the device memory of one allocation: a managed buffer, or an unmanaged one (a
// small cudaMalloc below DELTA_MIN_BYTES, or memory the shim did not allocate at all). Its
// entries are (address of the 8-byte word, value stored there), learnt from what the program
// writes into it:
//   - a host-to-device copy: the copied words whose values lead somewhere are the new entries
//     of the copied range, replacing what the range held (`write`);
//   - a device-to-device copy: the source range's entries, moved to the destination (`copy`);
//   - a memset: no pointer survives it (`clear`);
//   - the table's allocation freed: the table goes (`erase`, `removeAllocation`).
// A launch that touches a table follows its distinct `values`, not cached buffer ids: the kernel
// will dereference exactly those values, whatever buffer lies at them by then.
//
// Unmanaged allocations made through the shim are remembered here (base and size, nothing
// else), so that a table in one knows its extent, and a value pointing into one (a table of
// tables) is kept.
//
// Plain data structure, no CUDA: the residency lock guards it. Every query a launch makes is
// O(log tables), after a two-comparison reject of addresses outside every table.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

namespace delta::shim {

class PointerTables {
 public:
  struct Range {
    uint64_t base = 0;
    uint64_t bytes = 0;
    bool valid() const { return bytes > 0; }
    bool contains(uint64_t address) const { return address >= base && address - base < bytes; }
  };
  struct Entry {
    uint64_t at;     // address of the 8-byte word in device memory
    uint64_t value;  // what it holds
  };
  struct Table {
    Range range;
    std::vector<Entry> entries;    // by address
    std::vector<uint64_t> values;  // the distinct values of `entries`, sorted
  };

  // ---- unmanaged allocations ----
  void addAllocation(uint64_t base, uint64_t bytes);
  // Forgets the allocation that starts at `base`, and the table in it. False: not known.
  bool removeAllocation(uint64_t base);
  // The known unmanaged allocation holding `address`; invalid when none.
  Range allocationContaining(uint64_t address) const;
  size_t allocationCount() const { return allocations_.size(); }

  // ---- tables ----
  bool empty() const { return tables_.empty(); }
  size_t size() const { return tables_.size(); }
  // The table whose range holds `address`, or nullptr.
  const Table* tableContaining(uint64_t address) const {
    if (address < low_ || address >= high_) return nullptr;
    auto it = tables_.upper_bound(address);
    if (it == tables_.begin()) return nullptr;
    --it;
    return it->second.range.contains(address) ? &it->second : nullptr;
  }
  const Table* tableAt(uint64_t base) const {
    auto it = tables_.find(base);
    return it == tables_.end() ? nullptr : &it->second;
  }
  // True when some table has an entry in [at, at + bytes).
  bool anyEntriesIn(uint64_t at, uint64_t bytes) const;

  // The words of [at, at + bytes), which lie in the allocation `range`, now hold `found`
  // (sorted by address, each inside the span): what they held before is forgotten. A table
  // left without entries goes.
  void write(Range range, uint64_t at, uint64_t bytes, std::span<const Entry> found);
  // A device-to-device copy of [source, source + bytes) to [destination, ...), which lies in the
  // allocation `destinationRange`: the destination words take the source words' entries.
  void copy(uint64_t source, Range destinationRange, uint64_t destination, uint64_t bytes);
  // Every entry in [at, at + bytes) is forgotten (a memset, or data written over a table).
  void clear(uint64_t at, uint64_t bytes);
  // Forgets the table that starts at `base`, if any.
  void erase(uint64_t base);

 private:
  // Replaces the entries of `table` in [at, at + bytes) with `found`; drops the table if empty.
  void replace(std::map<uint64_t, Table>::iterator table, uint64_t at, uint64_t bytes,
               std::span<const Entry> found);
  std::map<uint64_t, Table>::iterator tableFor(Range range);
  void refreshValues(Table& table);
  void refreshSpan();

  std::map<uint64_t, Table> tables_;         // by range base
  std::map<uint64_t, uint64_t> allocations_;  // unmanaged: base -> bytes
  uint64_t allocationsLow_ = UINT64_MAX;      // every allocation lies in [low, high): a scan of
  uint64_t allocationsHigh_ = 0;              // data rejects nearly every word with two compares
  uint64_t low_ = UINT64_MAX;                 // every table lies in [low_, high_)
  uint64_t high_ = 0;
};

}  // namespace delta::shim
