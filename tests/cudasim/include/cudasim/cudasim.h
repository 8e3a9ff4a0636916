/* cudasim: the CPU implementation of the CUDA driver, runtime and CUPTI subset DELTA uses.
 *
 * This is the only platform-specific header a test program needs. Everything else is the
 * real CUDA API from the toolkit's headers: programs written against cuda.h /
 * cuda_runtime_api.h run unchanged on cudasim, which is what makes it a test platform.
 *
 * A "kernel" on cudasim is a host function. A program registers it once, keyed by the same
 * pointer it later hands to cudaLaunchKernel (its "symbol"); cudaGetFuncBySymbol gives the
 * CUfunction for the driver API. The body runs later, on the worker thread of the stream it
 * was launched on, and reaches device memory through plain pointers: a pointer to memory that
 * is not mapped (or mapped without access) faults, and cudasim reports the address, the call
 * and the kernel, then aborts, as a GPU would stop on an illegal address.
 *
 * params: one pointer per parameter to a private copy of its value, taken at launch time
 *         (the same shape as cuLaunchKernel's kernelParams).
 * paramSizes: the byte size of each parameter. Parameters are laid out in a packed buffer
 *         (for cuLaunchKernel's `extra` and cuFuncGetParamInfo) each at the next offset aligned
 *         to the largest power of two that divides its size, capped at 8.
 */
#ifndef CUDASIM_CUDASIM_H
#define CUDASIM_CUDASIM_H

#include <stddef.h>
#include <stdint.h>
#include <vector_types.h> /* dim3 */

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*cudasimKernelBody)(void** params, dim3 grid, dim3 block);

/* Registers (or re-registers, replacing the body) the kernel keyed by `symbol`. `name` is
 * what CUPTI reports as symbolName and cuFuncGetName returns; it is copied. */
void cudasimRegisterKernel(const void* symbol, const char* name,
                           void (*body)(void** params, dim3 grid, dim3 block),
                           int paramCount, const size_t* paramSizes);

/* Test hook: replaces the faults cudasim injects (CUDASIM_FAULTS, at start) with `spec`, in
 * the same syntax ("" or NULL: none), and restarts their counters. Lets a program fail only
 * what comes after its own set-up, e.g. cudasimSetFaults("hostalloc-fail-after=0").
 * The faults:
 *   memcreate-fail-after=N[:K]  cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (the device is full)
 *   device-taken=SIZE           SIZE bytes of the device are held by another process
 *   copy-fail-after=N[:K]       copies: CUDA_ERROR_OUT_OF_MEMORY (any direction,
 *   htod-fail-after=N[:K]       host to device, device to host)
 *   dtoh-fail-after=N[:K]
 *   slow-stream-us=U            every item of work on every stream starts U us late
 *   slow-copy-us=U              every copy runs U us late
 *   hostalloc-fail-after=N[:K]  cuMemHostAlloc/cuMemAllocHost: CUDA_ERROR_OUT_OF_MEMORY
 *   pinned-limit=SIZE           pinned host memory (allocated + registered) at most SIZE
 *   cupti-subscribe-fail        cuptiSubscribe: CUPTI_ERROR_NOT_INITIALIZED
 *   cupti-enable-fail           cuptiEnableCallback/Domain: CUPTI_ERROR_NOT_INITIALIZED
 *   paraminfo-fail              cuFuncGetParamInfo/cuKernelGetParamInfo: CUDA_ERROR_NOT_SUPPORTED
 *   foreign-stubs               cudaGetFuncBySymbol: cudaErrorInvalidDeviceFunction (stubs of
 *                               another runtime instance); launches still run
 * "-fail-after=N[:K]": the calls after the first N fail, K of them (without ":K", all).
 * SIZE: bytes with an optional K, M, G or T (powers of 1024). Details: driver/faults.h.
 * Returns NULL, or why `spec` is not valid (the faults in force are then unchanged). */
const char* cudasimSetFaults(const char* spec);

/* Called by a kernel body: the kernel takes `nanoseconds` of device time. The compute engine (one,
 * shared by every stream) is busy that long; the kernel's stream reaches its next work, and its
 * events fire, only then. Elsewhere than in a kernel body it does nothing. Host-side copies take
 * time when CUDASIM_H2D_GBPS / CUDASIM_D2H_GBPS are set (GB/s; device copies and memsets then at
 * CUDASIM_D2D_GBPS, default 1000); CUDASIM_VERBOSE=1 reports at exit whether the host kept up.
 * Details: driver/timing.h. */
void cudasimKernelTime(int64_t nanoseconds);

/* How many timed items so far took longer on the host than their modeled time (each then ends
 * when its host work does, so the modeled clock is behind by that much): while it is 0, event
 * times are exactly the model's arithmetic, which is what tests check. */
uint64_t cudasimTimingOverruns(void);
/* By how much, in all, those items outlasted their modeled time (ns): read before and after a
 * measured span, how much of the span this machine, not the model, may account for. */
int64_t cudasimTimingOverrunNs(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CUDASIM_CUDASIM_H */
