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

#define DELTA_API_VERSION 3

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
  uint64_t stall_ns;             /* host time spent waiting for memory (evictions, frees) */
  uint64_t over_budget_launches;
  uint64_t unanalysed_launches;
  /* Since API version 2. */
  uint64_t drops;                /* buffers released without a copy, to be recomputed */
  uint64_t recomputes;           /* dropped buffers regenerated (by a callback or the framework) */
  uint64_t recompute_failures;   /* callbacks that returned an error */
  uint64_t recompute_ns;         /* device time of callback recomputes, as measured */
};
/* 0 on success; -1 when the shim is not active or `stats` is NULL. */
int delta_get_stats(struct delta_stats* stats, size_t size);

/* Never evict the buffer holding `ptr` (pin) / allow it again (unpin). 0 on success, -1 when
 * `ptr` is not in a managed buffer. Use for memory reached in ways the shim cannot see. */
int delta_pin(const void* ptr);
int delta_unpin(const void* ptr);

/* ---- A framework's own virtual memory (since API version 3) ------------------------------
 *
 * Memory the program maps itself (cuMemCreate + cuMemMap: PyTorch's expandable segments) is
 * paged one mapping at a time. A kernel's pointer into it is taken to reach everything from its
 * mapping to the end of the run of adjoining mappings, because the shim cannot see where the
 * framework's blocks end; so paging frees little until the framework says so. Declare each block
 * the framework hands out there (its allocator's allocation: [ptr, ptr + bytes)), and a pointer
 * into it reaches only the mappings under it. A declaration replaces those it overlaps; 0 bytes
 * forgets the one at `ptr`; unmapping forgets those in the range. A declaration must stay true
 * while kernels run on the block: a block reused at another size is declared again first.
 * 0 on success, -1 when the shim is not active or `ptr` is not in the program's own memory. */
int delta_declare_extent(const void* ptr, size_t bytes);

/* ---- Recompute (since API version 2) ---------------------------------------------------
 *
 * A buffer whose contents the program can regenerate may be registered as recomputable: under
 * memory pressure the shim may then drop it (release its memory without copying it to the
 * host) when recomputing it is cheaper than the part of a copy back that prefetching cannot
 * hide. The buffer keeps its address; only its contents are gone until regenerated.
 *
 * `cost_ns` is the caller's estimate of the device time the regeneration takes; the shim
 * corrects it from what it measures. Registering again replaces the previous registration.
 * All functions return 0 on success and -1 when the shim is not active or `ptr` is not in a
 * managed buffer (nothing changes then).
 */

/* Regenerates the contents of the buffer at `ptr` (`bytes` long, the buffer's start) in place:
 * enqueue on `stream` (a cudaStream_t) the work that rewrites them, and return 0. The shim calls
 * it when a launch, copy or memset is about to touch the dropped buffer, on the thread making
 * that call and before the call proceeds; the work may read other managed buffers (the shim
 * makes them resident first, recomputing them too if need be, nested up to a bounded depth).
 * It must not free managed buffers or block on other threads' CUDA work. A non-zero return means
 * it could not: the touching call then fails with a CUDA error (cudaErrorUnknown /
 * CUDA_ERROR_UNKNOWN), the buffer stays dropped, and nothing else changes. Calls are
 * serialised: at most one thread runs recompute callbacks at a time.
 * Only calls the shim interposes can fail this way (cudaLaunchKernel, cuLaunchKernel); work it
 * sees only through CUPTI (copies, memsets, other launch entry points) still gets the callback,
 * but after a failure it would run against unmapped memory and fault: docs/recompute.md. */
typedef int (*delta_recompute_fn)(void* ctx, void* ptr, size_t bytes, void* stream);

int delta_register_recompute(const void* ptr, uint64_t cost_ns, delta_recompute_fn fn, void* ctx);

/* Framework-managed mode: the shim may drop the buffer and say so (delta_is_dropped, and the
 * notifier below); the framework promises to regenerate it before any use, between
 * delta_begin_recompute and delta_recomputed. A launch that touches a dropped buffer otherwise
 * is a framework bug: the shim fails that call with a CUDA error (cudaErrorUnknown) and one line
 * naming the buffer and the kernel, rather than let it run on lost contents (the same limit as
 * above: a copy or memset seen only through CUPTI gets the line, then faults). */
int delta_register_framework_managed(const void* ptr, uint64_t cost_ns);

/* The buffer is no longer recomputable: from now on it is only ever swapped. A buffer already
 * dropped is first regenerated by its callback (on the legacy default stream); a
 * framework-managed one stays dropped and returns 1: regenerate it or free it. */
int delta_unregister(const void* ptr);

/* 1: the buffer's contents are dropped; 0: they are intact (resident or on the host). */
int delta_is_dropped(const void* ptr);

/* Framework-managed regeneration: call delta_begin_recompute before using a framework-managed
 * buffer. When its contents were dropped it gives it memory again (contents undefined) and
 * returns 1: the framework must now enqueue the work that regenerates it (on any stream; that
 * work may touch the buffer), then call delta_recomputed; until then the buffer is never
 * evicted. It returns 0 when the contents are intact: nothing to do, and no delta_recomputed.
 * Either way the buffer is not dropped again before the next launch, copy or memset that uses
 * it (it may be swapped, which loses nothing), so a framework can check several buffers one
 * after the other and then launch the work that reads them all. */
int delta_begin_recompute(const void* ptr);
int delta_recomputed(const void* ptr);

/* Called, with `ctx`, for every framework-managed buffer the shim drops, after the drop and
 * outside the shim's locks, on the thread whose call needed the memory. It must not call CUDA
 * functions; delta_* queries are allowed. NULL removes it. Returns 0. */
typedef void (*delta_drop_fn)(void* ctx, void* ptr, size_t bytes);
int delta_set_drop_notifier(delta_drop_fn fn, void* ctx);

/* The start of a training iteration: lets the policy learn the iteration's access pattern
 * exactly instead of detecting it. Returns 0 (also when called before the first allocation). */
int delta_mark_iteration(void);

/* ---- PyTorch CUDAPluggableAllocator entry points (since API version 2) ------------------
 * torch.cuda.memory.CUDAPluggableAllocator(path_to_libdelta, "delta_torch_malloc",
 * "delta_torch_free") routes every tensor allocation to the shim, so that the shim sees each
 * tensor's exact lifetime. Allocation failures return NULL, as PyTorch expects. */
void* delta_torch_malloc(ptrdiff_t size, int device, void* stream);
void delta_torch_free(void* ptr, ptrdiff_t size, int device, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DELTA_DELTA_H */
