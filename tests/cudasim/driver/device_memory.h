// Device memory of the simulated GPU: one reserved range of the process's address space
// stands for the device's virtual address space, and one memory file stands for its
// physical memory. Allocating maps pieces of the file into the range; memory that is
// reserved but not mapped, or mapped without access, stays PROT_NONE, so any touch faults
// (see fault_handler.h) the way a GPU stops on an illegal address.
//
// Backing physical memory with a file (memfd) is what lets another process map the same
// bytes for CUDA IPC. Every call takes one mutex: this is a test platform, and correctness
// of the semantics matters more than its speed.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "range_allocator.h"

namespace cudasim {

inline constexpr uint64_t kGranularity = 2ull << 20;  // VMM mapping granularity
inline constexpr uint64_t kPageSize = 4096;

class DeviceMemory {
 public:
  explicit DeviceMemory(uint64_t capacity);

  uint64_t capacity() const { return capacity_; }
  uint64_t used();

  // Writes the first `bytes` of physical memory (at most the capacity) once, leaving it zero
  // as it was. A GPU's memory costs nothing the first time it is reached; a process pays a page
  // fault for each page of a file the first time it touches it, and a virtual machine whose
  // host backs guest memory lazily pays far more (this one: 6-12 us a page, so that a copy
  // into memory never reached before runs at 0.3-0.7 GB/s). Allocation is first fit from the
  // file's start, so a program that stays within `bytes` of physical memory never pays it
  // inside a timed copy (CUDASIM_WARM_MEMORY).
  void warm(uint64_t bytes);

  // True when [address, address + bytes) lies in the device address space at all.
  bool inAddressSpace(uint64_t address, uint64_t bytes) const {
    return address >= base_ && bytes <= size_ && address - base_ <= size_ - bytes;
  }
  // True when [address, address + bytes) lies inside one allocation, reservation or
  // imported range: what the driver accepts as a device pointer for a copy or memset.
  bool isDeviceRange(uint64_t address, uint64_t bytes);

  // cuMemAlloc / cuMemFree (the caller has synchronised the device before freeing).
  CUresult allocate(uint64_t bytes, CUdeviceptr* out);
  CUresult free(CUdeviceptr address);
  CUresult addressRange(CUdeviceptr address, CUdeviceptr* base, size_t* bytes);

  // Virtual memory management.
  CUresult reserve(uint64_t bytes, uint64_t alignment, uint64_t hint, CUdeviceptr* out);
  CUresult freeReservation(CUdeviceptr address, uint64_t bytes);
  CUresult create(uint64_t bytes, uint64_t handleTypes, CUmemGenericAllocationHandle* out);
  CUresult release(CUmemGenericAllocationHandle handle);
  CUresult map(CUdeviceptr address, uint64_t bytes, uint64_t offset,
               CUmemGenericAllocationHandle handle);
  CUresult unmap(CUdeviceptr address, uint64_t bytes);
  CUresult setAccess(CUdeviceptr address, uint64_t bytes, CUmemAccess_flags flags);
  CUresult exportToFd(CUmemGenericAllocationHandle handle, int* fd);
  CUresult importFromFd(int fd, CUmemGenericAllocationHandle* out);
  CUresult properties(CUmemGenericAllocationHandle handle, CUmemAllocationProp* prop);
  CUresult retainHandle(CUdeviceptr address, CUmemGenericAllocationHandle* out);

  // Managed memory (cuMemAllocManaged). It lies in the device address space like cuMemAlloc
  // memory, but is always mapped read-write, so the host reaches it through the same pointer as
  // kernels do. A GPU gets there by migrating pages on fault; cudasim migrates nothing: the bytes
  // always live in host memory and never count against the device's capacity, so managed memory
  // can oversubscribe the device as it can on a GPU with concurrent managed access.
  CUresult allocateManaged(uint64_t bytes, CUdeviceptr* out);
  // True when [address, address + bytes) lies inside one managed allocation.
  bool isManagedRange(uint64_t address, uint64_t bytes);

  // What cuMemAdvise and cuMemPrefetchAsync record and cuMemRangeGetAttribute reports, page by
  // page (the driver rounds ranges out to whole CPU pages). Values are device ordinals,
  // CU_DEVICE_CPU, or CU_DEVICE_INVALID (none); read-mostly is 0 or 1. The range must lie in
  // one managed allocation (CUDA_ERROR_INVALID_VALUE otherwise).
  enum class RangeAttribute { kReadMostly, kPreferredLocation, kLastPrefetchLocation };
  CUresult setRangeAttribute(uint64_t address, uint64_t bytes, RangeAttribute attribute, int value);
  // The value every page of the range has; CU_DEVICE_INVALID (0 for read-mostly) when they differ.
  CUresult rangeAttribute(uint64_t address, uint64_t bytes, RangeAttribute attribute, int* value);

  // Memory pools (memory_pool.h). A pool takes its backing in chunks: physical memory mapped
  // read-write at a granularity-aligned range, counted as used device memory, but no allocation
  // of its own (a chunk is not a device pointer). The pool's allocations inside a chunk are
  // registered as sub-allocations, which copies, memsets and cuMemGetAddressRange see as they
  // see cuMemAlloc memory. Unregistering one changes no mapping: only freeing the chunk does.
  CUresult allocateChunk(uint64_t bytes, CUdeviceptr* out);
  void freeChunk(CUdeviceptr address);
  void addSubAllocation(CUdeviceptr address, uint64_t bytes);
  void removeSubAllocation(CUdeviceptr address);

  // How the copy engines reach device memory. A GPU's copy engine writes physical memory through
  // page tables set up when the memory was mapped; a process's first touch of a new mapping
  // instead takes a page fault per 4 KiB page, which on some machines (a virtual machine with
  // slow faults) costs twenty times the copy itself, and would time the machine, not the model.
  // So copies go through one lasting mapping of the physical memory file: `pieces` gets the
  // physical bytes behind [address, address + bytes), in order. False (and `pieces` left
  // partial) when some byte is not mapped with the access asked for, or does not live in the pool
  // file (exportable or imported memory, pools' chunks): the caller then copies through the device
  // address, which faults where it must. `epoch` gets mappingEpoch() as of the answer.
  struct Piece {
    std::byte* data;
    uint64_t bytes;
  };
  bool physicalPieces(uint64_t address, uint64_t bytes, bool write, std::vector<Piece>* pieces,
                      uint64_t* epoch);
  // Changes whenever access to some device memory is taken away (unmapped, freed, access
  // lowered). A copy that ran through physicalPieces() and finds it changed asks again: device
  // memory taken away under a copy is an illegal address, as on a GPU.
  uint64_t mappingEpoch() const { return epoch_.load(std::memory_order_acquire); }

  // Legacy IPC, for cuMemAlloc memory only.
  CUresult ipcExport(CUdeviceptr address, CUipcMemHandle* out);
  CUresult ipcOpen(const CUipcMemHandle& handle, CUdeviceptr* out);
  CUresult ipcClose(CUdeviceptr address);

 private:
  enum class RegionKind { kAllocation, kReservation, kImport, kManaged, kSubAllocation };
  // One attribute over the pages of a managed allocation, piecewise constant: each entry holds
  // from its page offset to the next entry's (the first entry is at offset 0).
  using PageValues = std::map<uint64_t, int>;
  struct Region {
    uint64_t bytes;          // what the program asked for
    uint64_t addressBytes;   // what was taken from the address space (guard page included)
    RegionKind kind;
    uint64_t physicalOffset; // allocations: where in the physical file
    uint64_t physicalBytes;
    uint64_t serial;
    PageValues readMostly{{0, 0}};  // managed allocations only, as are the two below
    PageValues preferredLocation{{0, CU_DEVICE_INVALID}};
    PageValues lastPrefetchLocation{{0, CU_DEVICE_INVALID}};
  };
  struct Physical {
    int fd;               // the pool file, or a file of its own when it may be exported
    bool ownFile;
    bool imported;
    uint64_t offset;
    uint64_t bytes;
    uint64_t handleTypes;
    int mappings = 0;
    int references = 1;   // cuMemCreate / import / retain, minus cuMemRelease
    // cuMemCreate memory in the pool file: where its bytes are, in order (one piece when a
    // single free run held it). A GPU maps physical memory page by page, so a fragmented
    // device still gives memory as long as it has enough in all.
    std::vector<std::pair<uint64_t, uint64_t>> pieces;
  };
  struct Mapping {
    uint64_t bytes;
    CUmemGenericAllocationHandle handle;
    uint64_t offset;                   // where in the handle's memory the mapping starts
    int protection = 0;                // PROT_*; kMixedProtection when set on part of it only
  };
  static constexpr int kMixedProtection = -1;
  struct Chunk {
    uint64_t addressBytes;  // guard page included
    std::vector<std::pair<uint64_t, uint64_t>> pieces;  // physical offset, bytes
  };

  std::map<uint64_t, Region>::iterator regionContaining(uint64_t address, uint64_t bytes);
  // True when `bytes` more physical memory can be had (mutex_ held).
  bool fits(uint64_t bytes) const;
  // The managed allocation holding [address, address + bytes) and the range's page span within
  // it, or regions_.end() (also for bytes == 0).
  std::map<uint64_t, Region>::iterator managedPages(uint64_t address, uint64_t bytes,
                                                    uint64_t* firstPage, uint64_t* endPage);
  static PageValues& pageValues(Region& region, RangeAttribute attribute);
  // Physical memory goes when nothing refers to it: no handle and no mapping.
  void freeIfUnused(std::map<CUmemGenericAllocationHandle, Physical>::iterator it);
  void releasePhysical(const Physical& physical);
  // Makes the range fault again (reserved, PROT_NONE) and moves the epoch on.
  void takeAway(uint64_t address, uint64_t bytes);
  // physicalPieces() for one pool-file range of a handle's memory.
  void appendPhysical(const Physical& physical, uint64_t offset, uint64_t bytes,
                      std::vector<Piece>* pieces) const;

  const uint64_t capacity_;
  uint64_t base_ = 0;
  uint64_t size_ = 0;
  int poolFd_ = -1;
  std::byte* physicalWindow_ = nullptr;  // the pool file, mapped once, whole (physicalPieces)
  std::atomic<uint64_t> epoch_{0};

  std::mutex mutex_;
  uint64_t used_ = 0;
  uint64_t nextSerial_ = 1;
  CUmemGenericAllocationHandle nextHandle_ = 0x100000;
  RangeAllocator addresses_;
  RangeAllocator pool_;
  std::map<uint64_t, Region> regions_;
  std::map<uint64_t, Mapping> mappings_;
  std::map<CUmemGenericAllocationHandle, Physical> physicals_;
  std::map<uint64_t, Chunk> chunks_;
};

}  // namespace cudasim
