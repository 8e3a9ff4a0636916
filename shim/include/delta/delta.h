/* DELTA's public C API: what a program or framework may ask of libdelta.so.
 *
 * Find the functions at run time with dlsym(RTLD_DEFAULT, "delta_...") so that the same
 * program runs with and without the shim; when a lookup returns NULL, the shim is not loaded.
 * Every function is safe to call from any thread. Pointers are device pointers as returned
 * by cudaMalloc/cuMemAlloc; pointers the shim does not manage are reported as such.
 *
 * Versioning: DELTA_API_VERSION grows when functions are added; existing ones keep their
 * signature and meaning. delta_api_version() tells the version of the loaded library.
 */
#ifndef DELTA_DELTA_H
#define DELTA_DELTA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DELTA_API_VERSION 1

/* The API version of the loaded libdelta.so (DELTA_API_VERSION it was built with). */
int delta_api_version(void);

/* Its version as text, e.g. "0.1.0". */
const char* delta_version(void);

/* 1 when the shim manages memory in this process; 0 in pass-through mode (DELTA_DISABLE=1,
 * no GPU or driver, CUPTI unavailable) or before the first CUDA allocation. */
int delta_is_active(void);

/* What the shim has done so far. `size` is sizeof(struct delta_stats) as the caller knows it:
 * a newer library fills only that much, so old callers keep working. */
struct delta_stats {
  uint64_t budget_bytes;
  uint64_t resident_bytes;       /* managed bytes resident now */
  uint64_t peak_resident_bytes;
  uint64_t live_buffers;
  uint64_t evictions;
  uint64_t restores;
  uint64_t bytes_to_host;
  uint64_t bytes_to_device;
  uint64_t stall_ns;             /* host time spent waiting for evictions */
  uint64_t over_budget_launches;
  uint64_t unanalysed_launches;
};
/* 0 on success; -1 when the shim is not active or `stats` is NULL. */
int delta_get_stats(struct delta_stats* stats, size_t size);

/* Never evict the buffer holding `ptr` (pin) / allow it again (unpin). 0 on success, -1 when
 * `ptr` is not in a managed buffer. Use for memory reached in ways the shim cannot see. */
int delta_pin(const void* ptr);
int delta_unpin(const void* ptr);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DELTA_DELTA_H */
