// What one logical thread of each train-mlp kernel computes. The cudasim bodies
// (mlp_kernels_sim.cpp) and the CUDA kernels (mlp_kernels.cu) both run exactly this code per
// thread, so a result does not depend on the platform.
//
// Bit-for-bit equality between CPU and GPU rests on three rules kept here:
//  - only +, -, *, / and sqrt, which IEEE 754 rounds correctly on both (CUDA's defaults
//    -prec-div=true and -prec-sqrt=true; no tanh/exp, whose libraries differ);
//  - no contraction of a * b + c into a fused multiply-add: the CPU build compiles with
//    -ffp-contract=off and the CUDA build must use -fmad=false;
//  - every sum has one fixed order, the same for any thread timing: a thread owns its
//    outputs, reductions go through per-chunk partials summed in chunk order, no atomics.
#pragma once

#include <cmath>
#include <cstdint>

#include "mlp_kernels.h"

#if defined(__CUDACC__)
#define MLP_HD __host__ __device__ __forceinline__
#else
#define MLP_HD inline __attribute__((always_inline))
#endif

namespace mlp {

// The slope of leaky ReLU for negative inputs.
inline constexpr float kLeakySlope = 0.0625f;

template <int In, int Out>
MLP_HD void linear_forward_thread(int64_t t, const float* x, const float* w, const float* b,
                                  float* y, int64_t rows) {
  if (t >= rows) return;
  float acc[Out];
  for (int o = 0; o < Out; ++o) acc[o] = b[o];
  const float* xr = x + t * In;
  for (int i = 0; i < In; ++i) {
    const float xi = xr[i];
    for (int o = 0; o < Out; ++o) acc[o] = acc[o] + xi * w[i * Out + o];
  }
  float* yr = y + t * Out;
  for (int o = 0; o < Out; ++o) yr[o] = acc[o];
}

template <int In, int Out>
MLP_HD void linear_backward_data_thread(int64_t t, const float* dy, const float* w, float* dx,
                                        int64_t rows) {
  if (t >= rows) return;
  float acc[In];
  for (int i = 0; i < In; ++i) acc[i] = 0.0f;
  const float* dyr = dy + t * Out;
  for (int o = 0; o < Out; ++o) {
    const float g = dyr[o];
    for (int i = 0; i < In; ++i) acc[i] = acc[i] + g * w[i * Out + o];
  }
  float* dxr = dx + t * In;
  for (int i = 0; i < In; ++i) dxr[i] = acc[i];
}

template <int In, int Out>
MLP_HD void linear_backward_weight_partials_thread(int64_t t, const float* x, const float* dy,
                                                   float* partials, int64_t rows,
                                                   int64_t chunk_rows) {
  const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
  if (t >= chunks * (In + 1)) return;
  const int64_t c = t / (In + 1);
  const int i = static_cast<int>(t % (In + 1));  // i == In: the bias, whose input is 1
  const int64_t begin = c * chunk_rows;
  const int64_t end = begin + chunk_rows < rows ? begin + chunk_rows : rows;
  float acc[Out];
  for (int o = 0; o < Out; ++o) acc[o] = 0.0f;
  for (int64_t r = begin; r < end; ++r) {
    const float a = i < In ? x[r * In + i] : 1.0f;
    const float* dyr = dy + r * Out;
    for (int o = 0; o < Out; ++o) acc[o] = acc[o] + a * dyr[o];
  }
  float* p = partials + (c * (In + 1) + i) * Out;
  for (int o = 0; o < Out; ++o) p[o] = acc[o];
}

// out[e] = f(a[e]) or f(a[e], b[e]) for the elements thread t owns. Whole groups go through
// local arrays with a fixed-length loop, so that a compiler may vectorise without proving
// that the outputs do not alias the inputs; the last, partial group is handled plainly.
template <typename F>
MLP_HD void map_thread_elements(int64_t t, int64_t count, const float* a, float* out, F f) {
  const int64_t base = t * kElementsPerThread;
  if (base >= count) return;
  if (count - base >= kElementsPerThread) {
    float v[kElementsPerThread];
    for (int k = 0; k < kElementsPerThread; ++k) v[k] = a[base + k];
    for (int k = 0; k < kElementsPerThread; ++k) v[k] = f(v[k]);
    for (int k = 0; k < kElementsPerThread; ++k) out[base + k] = v[k];
  } else {
    for (int64_t e = base; e < count; ++e) out[e] = f(a[e]);
  }
}

template <typename F>
MLP_HD void map_thread_elements(int64_t t, int64_t count, const float* a, const float* b,
                                float* out, F f) {
  const int64_t base = t * kElementsPerThread;
  if (base >= count) return;
  if (count - base >= kElementsPerThread) {
    float u[kElementsPerThread], v[kElementsPerThread];
    for (int k = 0; k < kElementsPerThread; ++k) u[k] = a[base + k];
    for (int k = 0; k < kElementsPerThread; ++k) v[k] = b[base + k];
    for (int k = 0; k < kElementsPerThread; ++k) u[k] = f(u[k], v[k]);
    for (int k = 0; k < kElementsPerThread; ++k) out[base + k] = u[k];
  } else {
    for (int64_t e = base; e < count; ++e) out[e] = f(a[e], b[e]);
  }
}

// Leaky ReLU multiplies by a selected factor (multiplying by 1 is exact) rather than selecting
// between results, which compilers tend to turn into a branch that random signs mispredict.
MLP_HD float leaky_relu(float x) { return x * (x > 0.0f ? 1.0f : kLeakySlope); }
MLP_HD float leaky_relu_grad(float dy, float x) { return dy * (x > 0.0f ? 1.0f : kLeakySlope); }
// softsign(x) = x / (1 + |x|): a smooth bounded activation made of correctly rounded operations;
// its derivative is 1 / (1 + |x|)^2.
MLP_HD float softsign(float x) { return x / (1.0f + (x < 0.0f ? -x : x)); }
MLP_HD float softsign_grad(float dy, float x) {
  const float d = 1.0f + (x < 0.0f ? -x : x);
  return dy / (d * d);
}

MLP_HD void leaky_relu_forward_thread(int64_t t, const float* x, float* y, int64_t count) {
  map_thread_elements(t, count, x, y, [](float v) { return leaky_relu(v); });
}

MLP_HD void leaky_relu_backward_thread(int64_t t, const float* dy, const float* x, float* dx,
                                       int64_t count) {
  map_thread_elements(t, count, dy, x, dx, [](float g, float v) { return leaky_relu_grad(g, v); });
}

MLP_HD void softsign_forward_thread(int64_t t, const float* x, float* y, int64_t count) {
  map_thread_elements(t, count, x, y, [](float v) { return softsign(v); });
}

MLP_HD void softsign_backward_thread(int64_t t, const float* dy, const float* x, float* dx,
                                     int64_t count) {
  map_thread_elements(t, count, dy, x, dx, [](float g, float v) { return softsign_grad(g, v); });
}

MLP_HD void mse_loss_thread(int64_t t, const float* p, const float* y, float* dp,
                            float* loss_partials, int64_t rows, int64_t chunk_rows,
                            float grad_scale) {
  const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
  if (t >= chunks) return;
  const int64_t begin = t * chunk_rows;
  const int64_t end = begin + chunk_rows < rows ? begin + chunk_rows : rows;
  float sum = 0.0f;
  for (int64_t r = begin; r < end; ++r) {
    const float e = p[r] - y[r];
    dp[r] = e * grad_scale;
    sum = sum + e * e;
  }
  loss_partials[t] = sum;
}

MLP_HD void loss_reduce_thread(int64_t t, const float* loss_partials, int64_t chunks,
                               float inv_rows, float* loss) {
  if (t != 0) return;
  float sum = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) sum = sum + loss_partials[c];
  loss[0] = sum * inv_rows;
}

MLP_HD void reduce_partials_thread(int64_t t, const PartialSlot* table, int first, int count,
                                   int64_t total) {
  if (t >= total) return;
  int64_t e = t;
  int s = first;
  while (s < first + count - 1 && e >= table[s].count) e -= table[s++].count;
  const PartialSlot& slot = table[s];
  if (e >= slot.count) return;
  float sum = 0.0f;
  const float* column = slot.partials + slot.offset + e;
  for (int64_t c = 0; c < slot.chunks; ++c) sum = sum + column[c * slot.stride];
  slot.grad[e] = slot.grad[e] + sum;
}

MLP_HD void sgd_momentum_thread(int64_t t, const ParamSlot* table, int first, int count,
                                int64_t total, float lr, float mu) {
  if (t >= total) return;
  int64_t e = t;
  int s = first;
  while (s < first + count - 1 && e >= table[s].count) e -= table[s++].count;
  const ParamSlot& slot = table[s];
  if (e >= slot.count) return;
  const float v = mu * slot.velocity[e] + slot.grad[e];
  slot.velocity[e] = v;
  slot.weight[e] = slot.weight[e] - lr * v;
}

MLP_HD void grad_norm_thread(int64_t t, const ParamSlot* table, int count, float* out) {
  if (t != 0) return;
  float sum = 0.0f;
  for (int s = 0; s < count; ++s) {
    for (int64_t e = 0; e < table[s].count; ++e) sum = sum + table[s].grad[e] * table[s].grad[e];
  }
  out[0] = sqrtf(sum);
}

}  // namespace mlp
