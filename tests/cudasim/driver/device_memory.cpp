#include "device_memory.h"

#include "faults.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>

namespace cudasim {
namespace {

// Device addresses: 1 TiB, as roomy as a GPU's. ThreadSanitizer's fixed memory layout leaves
// no single free range that large for mmap, so a TSan build reserves 64 GiB (still 16 times the
// default device memory).
#if defined(__SANITIZE_THREAD__)
constexpr uint64_t kAddressSpaceBytes = 1ull << 36;
#else
constexpr uint64_t kAddressSpaceBytes = 1ull << 40;
#endif
constexpr uint32_t kIpcMagic = 0x43534950;           // "CSIP"

// The contents of a CUipcMemHandle (64 opaque bytes): enough for another process to open
// the exporter's physical-memory file through /proc and map the same bytes.
struct IpcBlob {
  uint32_t magic;
  int32_t pid;
  int32_t fd;
  uint32_t reserved;
  uint64_t offset;
  uint64_t bytes;
  uint64_t serial;
};
static_assert(sizeof(IpcBlob) <= sizeof(CUipcMemHandle));

uint64_t roundUp(uint64_t value, uint64_t to) { return (value + to - 1) / to * to; }

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "cudasim: %s: %s\n", what, std::strerror(errno));
  std::abort();
}

// Puts the range back to reserved-and-inaccessible.
void makeInaccessible(uint64_t address, uint64_t bytes) {
  void* p = mmap(reinterpret_cast<void*>(address), bytes, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) die("mmap(PROT_NONE) of device addresses failed");
}

bool mapFile(uint64_t address, uint64_t bytes, int fd, uint64_t offset, int protection) {
  void* p = mmap(reinterpret_cast<void*>(address), bytes, protection, MAP_SHARED | MAP_FIXED,
                 fd, static_cast<off_t>(offset));
  return p != MAP_FAILED;
}

int newMemoryFile(const char* name, uint64_t bytes) {
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) die("memfd_create failed");
  // Device memory is a file only because it is simulated: the program's file size limit
  // (RLIMIT_FSIZE, which would also raise SIGXFSZ) is for files it writes, not for a GPU's
  // memory. Lift the soft limit while the file is sized (only up to the hard limit).
  rlimit limit{};
  const bool lift = getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != limit.rlim_max;
  if (lift) {
    const rlimit lifted{limit.rlim_max, limit.rlim_max};
    setrlimit(RLIMIT_FSIZE, &lifted);
  }
  const int sized = ftruncate(fd, static_cast<off_t>(bytes));
  if (lift) setrlimit(RLIMIT_FSIZE, &limit);
  if (sized != 0) die("ftruncate of device memory failed");
  return fd;
}

}  // namespace

DeviceMemory::DeviceMemory(uint64_t capacity) : capacity_(capacity), addresses_(0, 0), pool_(0, 0) {
  void* p = mmap(nullptr, kAddressSpaceBytes, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) die("reserving the device address space failed");
  // Start on a granularity boundary, and leave the first granule unused so that no valid
  // device pointer is ever the start of the range.
  base_ = roundUp(reinterpret_cast<uint64_t>(p), kGranularity) + kGranularity;
  size_ = reinterpret_cast<uint64_t>(p) + kAddressSpaceBytes - base_;
  size_ -= size_ % kGranularity;
  addresses_ = RangeAllocator(base_, size_);
  poolFd_ = newMemoryFile("cudasim-device-memory", capacity_);
  pool_ = RangeAllocator(0, capacity_);
  void* window = mmap(nullptr, capacity_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
                      poolFd_, 0);
  if (window == MAP_FAILED) die("mapping the physical memory file failed");
  physicalWindow_ = static_cast<std::byte*>(window);
}

void DeviceMemory::warm(uint64_t bytes) {
  std::memset(physicalWindow_, 0, std::min(bytes, capacity_));
}

void DeviceMemory::takeAway(uint64_t address, uint64_t bytes) {
  makeInaccessible(address, bytes);
  epoch_.fetch_add(1, std::memory_order_acq_rel);
}

void DeviceMemory::appendPhysical(const Physical& physical, uint64_t offset, uint64_t bytes,
                                  std::vector<Piece>* pieces) const {
  uint64_t pieceStart = 0;  // offset in the handle of the piece at hand
  for (const auto& [fileOffset, pieceBytes] : physical.pieces) {
    const uint64_t from = std::max(offset, pieceStart);
    const uint64_t to = std::min(offset + bytes, pieceStart + pieceBytes);
    if (from < to)
      pieces->push_back(Piece{physicalWindow_ + fileOffset + (from - pieceStart), to - from});
    pieceStart += pieceBytes;
  }
}

bool DeviceMemory::physicalPieces(uint64_t address, uint64_t bytes, bool write,
                                  std::vector<Piece>* pieces, uint64_t* epoch) {
  if (bytes == 0 || !inAddressSpace(address, bytes)) return false;
  std::lock_guard lock(mutex_);
  *epoch = epoch_.load(std::memory_order_acquire);
  const uint64_t end = address + bytes;
  auto mapping = mappings_.upper_bound(address);
  if (mapping != mappings_.begin() &&
      std::prev(mapping)->first + std::prev(mapping)->second.bytes > address) {
    // Virtual memory management: one mapping after another, each with the access asked for.
    uint64_t cursor = address;
    for (--mapping; cursor < end; ++mapping) {
      if (mapping == mappings_.end() || mapping->first > cursor) return false;
      const Mapping& m = mapping->second;
      const bool allowed = m.protection != kMixedProtection &&
                           (m.protection & (write ? PROT_WRITE : PROT_READ)) != 0;
      const Physical& physical = physicals_.at(m.handle);
      if (!allowed || physical.fd != poolFd_ || physical.pieces.empty()) return false;
      const uint64_t to = std::min(end, mapping->first + m.bytes);
      appendPhysical(physical, m.offset + (cursor - mapping->first), to - cursor, pieces);
      cursor = to;
    }
    return true;
  }
  // cuMemAlloc memory: read-write, one run of the file.
  auto region = regionContaining(address, bytes);
  if (region == regions_.end() || region->second.kind != RegionKind::kAllocation ||
      address - region->first + bytes > region->second.physicalBytes)
    return false;
  pieces->push_back(
      Piece{physicalWindow_ + region->second.physicalOffset + (address - region->first), bytes});
  return true;
}

bool DeviceMemory::fits(uint64_t bytes) const {
  // What another process holds (an injected fault, faults.h) is not ours to allocate.
  const uint64_t taken = faults().deviceTaken.load(std::memory_order_relaxed);
  return taken <= capacity_ && used_ + bytes <= capacity_ - taken;
}

uint64_t DeviceMemory::used() {
  std::lock_guard lock(mutex_);
  return used_;
}

std::map<uint64_t, DeviceMemory::Region>::iterator DeviceMemory::regionContaining(
    uint64_t address, uint64_t bytes) {
  auto it = regions_.upper_bound(address);
  if (it == regions_.begin()) return regions_.end();
  --it;
  if (address - it->first + bytes > it->second.bytes) return regions_.end();
  return it;
}

bool DeviceMemory::isDeviceRange(uint64_t address, uint64_t bytes) {
  if (!inAddressSpace(address, bytes)) return false;
  std::lock_guard lock(mutex_);
  return regionContaining(address, bytes) != regions_.end();
}

CUresult DeviceMemory::allocate(uint64_t bytes, CUdeviceptr* out) {
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t physicalBytes = roundUp(bytes, kPageSize);
  std::lock_guard lock(mutex_);
  if (!fits(physicalBytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  auto offset = pool_.allocate(physicalBytes, kPageSize);
  if (!offset) return CUDA_ERROR_OUT_OF_MEMORY;
  // One unmapped page after each allocation turns most overruns into faults.
  const uint64_t addressBytes = physicalBytes + kPageSize;
  auto address = addresses_.allocate(addressBytes, kPageSize);
  if (!address) {
    pool_.release(*offset, physicalBytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (!mapFile(*address, physicalBytes, poolFd_, *offset, PROT_READ | PROT_WRITE))
    die("mapping device memory failed (too many mappings? see vm.max_map_count)");
  used_ += physicalBytes;
  regions_[*address] = Region{bytes, addressBytes, RegionKind::kAllocation, *offset,
                              physicalBytes, nextSerial_++};
  *out = *address;
  return CUDA_SUCCESS;
}

CUresult DeviceMemory::allocateManaged(uint64_t bytes, CUdeviceptr* out) {
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t mappedBytes = roundUp(bytes, kPageSize);
  std::lock_guard lock(mutex_);
  // A guard page after it, as after cuMemAlloc memory.
  const uint64_t addressBytes = mappedBytes + kPageSize;
  auto address = addresses_.allocate(addressBytes, kPageSize);
  if (!address) return CUDA_ERROR_OUT_OF_MEMORY;
  // Anonymous memory, reserved lazily (MAP_NORESERVE): pages exist once touched, as managed
  // memory on a GPU is populated on first access.
  void* p = mmap(reinterpret_cast<void*>(*address), mappedBytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    addresses_.release(*address, addressBytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  regions_[*address] = Region{bytes, addressBytes, RegionKind::kManaged, 0, mappedBytes,
                              nextSerial_++};
  *out = *address;
  return CUDA_SUCCESS;
}

bool DeviceMemory::isManagedRange(uint64_t address, uint64_t bytes) {
  if (!inAddressSpace(address, bytes)) return false;
  std::lock_guard lock(mutex_);
  auto it = regionContaining(address, bytes);
  return it != regions_.end() && it->second.kind == RegionKind::kManaged;
}

std::map<uint64_t, DeviceMemory::Region>::iterator DeviceMemory::managedPages(
    uint64_t address, uint64_t bytes, uint64_t* firstPage, uint64_t* endPage) {
  if (bytes == 0 || !inAddressSpace(address, bytes)) return regions_.end();
  auto it = regionContaining(address, bytes);
  if (it == regions_.end() || it->second.kind != RegionKind::kManaged) return regions_.end();
  const uint64_t offset = address - it->first;
  *firstPage = offset / kPageSize * kPageSize;
  *endPage = roundUp(offset + bytes, kPageSize);
  return it;
}

DeviceMemory::PageValues& DeviceMemory::pageValues(Region& region, RangeAttribute attribute) {
  switch (attribute) {
    case RangeAttribute::kReadMostly: return region.readMostly;
    case RangeAttribute::kPreferredLocation: return region.preferredLocation;
    case RangeAttribute::kLastPrefetchLocation: break;
  }
  return region.lastPrefetchLocation;
}

CUresult DeviceMemory::setRangeAttribute(uint64_t address, uint64_t bytes,
                                         RangeAttribute attribute, int value) {
  std::lock_guard lock(mutex_);
  uint64_t begin = 0, end = 0;
  auto it = managedPages(address, bytes, &begin, &end);
  if (it == regions_.end()) return CUDA_ERROR_INVALID_VALUE;
  PageValues& values = pageValues(it->second, attribute);
  // The value in force at `end` carries on after the range; everything inside is replaced.
  auto after = std::prev(values.upper_bound(end));
  const int valueAfter = after->second;
  values.erase(values.lower_bound(begin), values.upper_bound(end));
  values[begin] = value;
  if (end < it->second.physicalBytes) values.emplace(end, valueAfter);
  return CUDA_SUCCESS;
}

CUresult DeviceMemory::rangeAttribute(uint64_t address, uint64_t bytes, RangeAttribute attribute,
                                      int* value) {
  std::lock_guard lock(mutex_);
  uint64_t begin = 0, end = 0;
  auto it = managedPages(address, bytes, &begin, &end);
  if (it == regions_.end()) return CUDA_ERROR_INVALID_VALUE;
  PageValues& values = pageValues(it->second, attribute);
  auto entry = std::prev(values.upper_bound(begin));
  const int first = entry->second;
  bool uniform = true;
  for (++entry; entry != values.end() && entry->first < end; ++entry)
    uniform = uniform && entry->second == first;
  const int mixed = attribute == RangeAttribute::kReadMostly ? 0 : CU_DEVICE_INVALID;
  *value = uniform ? first : mixed;
  return CUDA_SUCCESS;
}

CUresult DeviceMemory::free(CUdeviceptr address) {
  std::lock_guard lock(mutex_);
  auto it = regions_.find(address);
  if (it == regions_.end() ||
      (it->second.kind != RegionKind::kAllocation && it->second.kind != RegionKind::kManaged))
    return CUDA_ERROR_INVALID_VALUE;
  const Region region = it->second;
  regions_.erase(it);
  takeAway(address, region.physicalBytes);
  if (region.kind == RegionKind::kManaged) {
    // Its pages were anonymous memory, returned by the remapping above.
    addresses_.release(address, region.addressBytes);
    return CUDA_SUCCESS;
  }
  releasePhysical(Physical{poolFd_, false, false, region.physicalOffset, region.physicalBytes,
                           0, 0, 1, {}});
  addresses_.release(address, region.addressBytes);
  return CUDA_SUCCESS;
}

CUresult DeviceMemory::addressRange(CUdeviceptr address, CUdeviceptr* base, size_t* bytes) {
  std::lock_guard lock(mutex_);
  auto it = regionContaining(address, 1);
  if (it == regions_.end()) return CUDA_ERROR_NOT_FOUND;
  if (base) *base = it->first;
  if (bytes) *bytes = it->second.bytes;
  return CUDA_SUCCESS;
}

CUresult DeviceMemory::reserve(uint64_t bytes, uint64_t alignment, uint64_t hint,
                               CUdeviceptr* out) {
  if (bytes == 0 || bytes % kGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
  if (alignment != 0 && (alignment & (alignment - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
  alignment = alignment < kGranularity ? kGranularity : alignment;
  std::lock_guard lock(mutex_);
  std::optional<uint64_t> address;
  // The address is a hint: honoured when free, otherwise anywhere, as the driver does.
  if (hint != 0 && hint % alignment == 0 && inAddressSpace(hint, bytes) &&
      addresses_.allocateAt(hint, bytes))
    address = hint;
  else
    address = addresses_.allocate(bytes, alignment);
  if (!address) return CUDA_ERROR_OUT_OF_MEMORY;
  regions_[*address] = Region{bytes, bytes, RegionKind::kReservation, 0, 0, nextSerial_++};
  *out = *address;
  return CUDA_SUCCESS;
}

CUresult DeviceMemory::freeReservation(CUdeviceptr address, uint64_t bytes) {
  std::lock_guard lock(mutex_);
  auto it = regions_.find(address);
  if (it == regions_.end() || it->second.kind != RegionKind::kReservation ||
      it->second.bytes != bytes)
    return CUDA_ERROR_INVALID_VALUE;
  // Mappings must be gone first: freeing addresses under live mappings would leave
  // physical memory referenced by addresses nobody owns.
  auto mapping = mappings_.lower_bound(address);
  if (mapping != mappings_.end() && mapping->first < address + bytes)
    return CUDA_ERROR_INVALID_VALUE;
  regions_.erase(it);
  addresses_.release(address, bytes);
  return CUDA_SUCCESS;
}

CUresult DeviceMemory::create(uint64_t bytes, uint64_t handleTypes,
                              CUmemGenericAllocationHandle* out) {
  if (bytes == 0 || bytes % kGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
  if (handleTypes & ~uint64_t(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    return CUDA_ERROR_NOT_SUPPORTED;
  if (faults().memCreate.fires()) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard lock(mutex_);
  if (!fits(bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  Physical physical{poolFd_, false, false, 0, bytes, handleTypes, 0, 1, {}};
  if (handleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    // Exportable memory gets a file of its own, so that what is exported is just it.
    physical.fd = newMemoryFile("cudasim-exportable", bytes);
    physical.ownFile = true;
  } else if (auto offset = pool_.allocate(bytes, kPageSize)) {
    physical.offset = *offset;
    physical.pieces.emplace_back(*offset, bytes);
  } else {
    physical.pieces = pool_.allocatePieces(bytes, kPageSize);
    if (physical.pieces.empty()) return CUDA_ERROR_OUT_OF_MEMORY;
    physical.offset = physical.pieces.front().first;
  }
  used_ += bytes;
  const CUmemGenericAllocationHandle handle = nextHandle_++;
  physicals_.emplace(handle, physical);
  *out = handle;
  return CUDA_SUCCESS;
}

void DeviceMemory::releasePhysical(const Physical& physical) {
  if (physical.imported) {
    close(physical.fd);
    return;
  }
  used_ -= physical.bytes;
  if (physical.ownFile) {
    close(physical.fd);
    return;
  }
  // The pages stay with the process, as a GPU's memory stays with its driver: memory created
  // again in the same place finds them present, with no page faults (which a GPU does not have,
  // and which made fresh memory copy at a fifth of the speed of reused memory), and with
  // whatever they held (a GPU does not clear new memory either). What the process holds is then
  // the most device memory it ever used at once, never more than the capacity.
  auto giveBack = [&](uint64_t offset, uint64_t bytes) { pool_.release(offset, bytes); };
  if (physical.pieces.empty()) {
    giveBack(physical.offset, physical.bytes);
    return;
  }
  for (const auto& [offset, bytes] : physical.pieces) giveBack(offset, bytes);
}

void DeviceMemory::freeIfUnused(std::map<CUmemGenericAllocationHandle, Physical>::iterator it) {
  if (it->second.references > 0 || it->second.mappings > 0) return;
  releasePhysical(it->second);
  physicals_.erase(it);
}

CUresult DeviceMemory::release(CUmemGenericAllocationHandle handle) {
  std::lock_guard lock(mutex_);
  auto it = physicals_.find(handle);
  if (it == physicals_.end() || it->second.references == 0) return CUDA_ERROR_INVALID_VALUE;
  it->second.references--;
  freeIfUnused(it);
  return CUDA_SUCCESS;
}

CUresult DeviceMemory::map(CUdeviceptr address, uint64_t bytes, uint64_t offset,
                           CUmemGenericAllocationHandle handle) {
  if (bytes == 0 || bytes % kGranularity != 0 || address % kGranularity != 0 ||
      offset % kGranularity != 0)
    return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(mutex_);
  auto physical = physicals_.find(handle);
  if (physical == physicals_.end() || physical->second.references == 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (offset + bytes > physical->second.bytes) return CUDA_ERROR_INVALID_VALUE;
  auto region = regionContaining(address, bytes);
  if (region == regions_.end() || region->second.kind != RegionKind::kReservation)
    return CUDA_ERROR_INVALID_VALUE;
  auto next = mappings_.lower_bound(address);
  if (next != mappings_.end() && next->first < address + bytes) return CUDA_ERROR_INVALID_VALUE;
  if (next != mappings_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.bytes > address) return CUDA_ERROR_INVALID_VALUE;
  }
  // Mapped but without access until cuMemSetAccess, as on the GPU; piece by piece when the
  // physical memory came in pieces.
  if (physical->second.pieces.size() <= 1) {
    if (!mapFile(address, bytes, physical->second.fd, physical->second.offset + offset, PROT_NONE))
      return CUDA_ERROR_OUT_OF_MEMORY;
  } else {
    uint64_t pieceStart = 0;  // offset in the handle of the piece at hand
    for (const auto& [fileOffset, pieceBytes] : physical->second.pieces) {
      const uint64_t from = std::max(offset, pieceStart);
      const uint64_t to = std::min(offset + bytes, pieceStart + pieceBytes);
      if (from < to && !mapFile(address + (from - offset), to - from, physical->second.fd,
                                fileOffset + (from - pieceStart), PROT_NONE)) {
        makeInaccessible(address, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
      }
      pieceStart += pieceBytes;
    }
  }
  physical->second.mappings++;
  mappings_[address] = Mapping{bytes, handle, offset};
  return CUDA_SUCCESS;
}

CUresult DeviceMemory::unmap(CUdeviceptr address, uint64_t bytes) {
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(mutex_);
  // The range must be exactly a run of whole, adjacent mappings.
  uint64_t cursor = address;
  auto it = mappings_.find(address);
  while (cursor < address + bytes) {
    if (it == mappings_.end() || it->first != cursor) return CUDA_ERROR_INVALID_VALUE;
    cursor += it->second.bytes;
    ++it;
  }
  if (cursor != address + bytes) return CUDA_ERROR_INVALID_VALUE;
  for (auto m = mappings_.find(address); m != mappings_.end() && m->first < address + bytes;) {
    takeAway(m->first, m->second.bytes);
    auto physical = physicals_.find(m->second.handle);
    physical->second.mappings--;
    freeIfUnused(physical);
    m = mappings_.erase(m);
  }
  return CUDA_SUCCESS;
}

CUresult DeviceMemory::setAccess(CUdeviceptr address, uint64_t bytes, CUmemAccess_flags flags) {
  int protection;
  switch (flags) {
    case CU_MEM_ACCESS_FLAGS_PROT_NONE: protection = PROT_NONE; break;
    case CU_MEM_ACCESS_FLAGS_PROT_READ: protection = PROT_READ; break;
    case CU_MEM_ACCESS_FLAGS_PROT_READWRITE: protection = PROT_READ | PROT_WRITE; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  if (bytes == 0 || address % kGranularity != 0 || bytes % kGranularity != 0)
    return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(mutex_);
  // Every byte of the range must be mapped.
  uint64_t cursor = address;
  auto first = mappings_.upper_bound(address);
  if (first != mappings_.begin()) --first;
  auto it = first;
  for (; cursor < address + bytes; ++it) {
    if (it == mappings_.end() || it->first > cursor || it->first + it->second.bytes <= cursor)
      return CUDA_ERROR_INVALID_VALUE;
    cursor = it->first + it->second.bytes;
  }
  if (mprotect(reinterpret_cast<void*>(address), bytes, protection) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  for (auto m = first; m != it; ++m) {
    const bool whole = m->first >= address && m->first + m->second.bytes <= address + bytes;
    m->second.protection = whole ? protection : kMixedProtection;
  }
  epoch_.fetch_add(1, std::memory_order_acq_rel);  // access may have been lowered
  return CUDA_SUCCESS;
}

CUresult DeviceMemory::exportToFd(CUmemGenericAllocationHandle handle, int* fd) {
  std::lock_guard lock(mutex_);
  auto it = physicals_.find(handle);
  if (it == physicals_.end() || it->second.references == 0) return CUDA_ERROR_INVALID_VALUE;
  if (!(it->second.handleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    return CUDA_ERROR_INVALID_VALUE;
  int copy = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *fd = copy;
  return CUDA_SUCCESS;
}

CUresult DeviceMemory::importFromFd(int fd, CUmemGenericAllocationHandle* out) {
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0 || st.st_size % kGranularity != 0)
    return CUDA_ERROR_INVALID_VALUE;
  int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard lock(mutex_);
  const CUmemGenericAllocationHandle handle = nextHandle_++;
  physicals_.emplace(handle, Physical{copy, true, true, 0, static_cast<uint64_t>(st.st_size),
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0, 1, {}});
  *out = handle;
  return CUDA_SUCCESS;
}

CUresult DeviceMemory::properties(CUmemGenericAllocationHandle handle, CUmemAllocationProp* prop) {
  std::lock_guard lock(mutex_);
  auto it = physicals_.find(handle);
  if (it == physicals_.end() || it->second.references == 0) return CUDA_ERROR_INVALID_VALUE;
  std::memset(prop, 0, sizeof(*prop));
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = 0;
  prop->requestedHandleTypes = static_cast<CUmemAllocationHandleType>(it->second.handleTypes);
  return CUDA_SUCCESS;
}

CUresult DeviceMemory::retainHandle(CUdeviceptr address, CUmemGenericAllocationHandle* out) {
  std::lock_guard lock(mutex_);
  auto it = mappings_.find(address);
  if (it == mappings_.end()) return CUDA_ERROR_INVALID_VALUE;
  physicals_.at(it->second.handle).references++;
  *out = it->second.handle;
  return CUDA_SUCCESS;
}

CUresult DeviceMemory::allocateChunk(uint64_t bytes, CUdeviceptr* out) {
  if (bytes == 0 || bytes % kGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(mutex_);
  if (!fits(bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  // Pools are built on the driver's virtual memory management: physical memory in as many
  // pieces as a fragmented device has, mapped behind one granularity-aligned range.
  Chunk chunk{bytes + kPageSize, pool_.allocatePieces(bytes, kPageSize)};
  if (chunk.pieces.empty()) return CUDA_ERROR_OUT_OF_MEMORY;
  auto address = addresses_.allocate(chunk.addressBytes, kGranularity);
  if (!address) {
    for (const auto& [offset, pieceBytes] : chunk.pieces) pool_.release(offset, pieceBytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  uint64_t cursor = *address;
  for (const auto& [offset, pieceBytes] : chunk.pieces) {
    if (!mapFile(cursor, pieceBytes, poolFd_, offset, PROT_READ | PROT_WRITE))
      die("mapping device memory failed (too many mappings? see vm.max_map_count)");
    cursor += pieceBytes;
  }
  used_ += bytes;
  chunks_.emplace(*address, std::move(chunk));
  *out = *address;
  return CUDA_SUCCESS;
}

void DeviceMemory::freeChunk(CUdeviceptr address) {
  std::lock_guard lock(mutex_);
  auto it = chunks_.find(address);
  if (it == chunks_.end()) return;
  const uint64_t bytes = it->second.addressBytes - kPageSize;
  takeAway(address, bytes);
  for (const auto& [offset, pieceBytes] : it->second.pieces) pool_.release(offset, pieceBytes);
  used_ -= bytes;
  addresses_.release(address, it->second.addressBytes);
  chunks_.erase(it);
}

void DeviceMemory::addSubAllocation(CUdeviceptr address, uint64_t bytes) {
  std::lock_guard lock(mutex_);
  regions_[address] = Region{bytes, 0, RegionKind::kSubAllocation, 0, 0, nextSerial_++};
}

void DeviceMemory::removeSubAllocation(CUdeviceptr address) {
  std::lock_guard lock(mutex_);
  auto it = regions_.find(address);
  if (it != regions_.end() && it->second.kind == RegionKind::kSubAllocation) regions_.erase(it);
}

CUresult DeviceMemory::ipcExport(CUdeviceptr address, CUipcMemHandle* out) {
  std::lock_guard lock(mutex_);
  auto it = regionContaining(address, 1);
  // Like the real driver: legacy IPC works on cuMemAlloc memory, not on VMM mappings.
  if (it == regions_.end() || it->second.kind != RegionKind::kAllocation)
    return CUDA_ERROR_INVALID_VALUE;
  IpcBlob blob{kIpcMagic, static_cast<int32_t>(getpid()), poolFd_, 0, it->second.physicalOffset,
               it->second.physicalBytes, it->second.serial};
  std::memset(out, 0, sizeof(*out));
  std::memcpy(out->reserved, &blob, sizeof(blob));
  return CUDA_SUCCESS;
}

CUresult DeviceMemory::ipcOpen(const CUipcMemHandle& handle, CUdeviceptr* out) {
  IpcBlob blob;
  std::memcpy(&blob, handle.reserved, sizeof(blob));
  if (blob.magic != kIpcMagic || blob.bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  // A process cannot open its own handles (the real driver refuses too).
  if (blob.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/fd/%d", blob.pid, blob.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;  // the exporter is gone
  std::lock_guard lock(mutex_);
  const uint64_t addressBytes = blob.bytes + kPageSize;
  auto address = addresses_.allocate(addressBytes, kPageSize);
  if (!address) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  bool mapped = mapFile(*address, blob.bytes, fd, blob.offset, PROT_READ | PROT_WRITE);
  close(fd);  // the mapping keeps the file
  if (!mapped) {
    addresses_.release(*address, addressBytes);
    return CUDA_ERROR_INVALID_VALUE;
  }
  regions_[*address] = Region{blob.bytes, addressBytes, RegionKind::kImport, 0, 0, blob.serial};
  *out = *address;
  return CUDA_SUCCESS;
}

CUresult DeviceMemory::ipcClose(CUdeviceptr address) {
  std::lock_guard lock(mutex_);
  auto it = regions_.find(address);
  if (it == regions_.end() || it->second.kind != RegionKind::kImport)
    return CUDA_ERROR_INVALID_VALUE;
  takeAway(address, it->second.bytes);
  addresses_.release(address, it->second.addressBytes);
  regions_.erase(it);
  return CUDA_SUCCESS;
}

}  // namespace cudasim
