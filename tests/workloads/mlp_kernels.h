// The kernels of the train-mlp workload, as the training program sees them: plain host
// declarations, one per kernel, which it hands to cudaLaunchKernel as the kernel's symbol.
//
// Two builds define them. On cudasim, mlp_kernels_sim.cpp defines each name as a host stub
// and registers it with a body that runs the per-thread code of mlp_kernel_math.h for every
// logical thread of the grid. For real GPUs, mlp_kernels.cu defines the same names as
// __global__ functions running the same per-thread code; nvcc gives each a host stub of this
// exact signature and registers it, so this header and train_mlp.cpp serve both builds.
//
// Every kernel is one-dimensional: logical thread t = blockIdx.x * blockDim.x + threadIdx.x,
// and threads past the work count return at once (the grid is rounded up to whole blocks).
// Sizes are element counts; rows are int64 so that large batches cannot overflow.
#pragma once

#include <cstdint>

namespace mlp {

// Elements per thread of the elementwise kernels, as vectorised CUDA kernels do (a CPU
// vectorises the fixed-length loop; a GPU thread issues wider loads).
inline constexpr int kElementsPerThread = 8;

// One parameter tensor as the optimizer and the gradient-norm kernels see it. A table of
// these lives in device memory, so the kernels reach the tensors through pointers that are
// not kernel parameters (as batched GEMM's pointer arrays do).
struct ParamSlot {
  float* weight;
  float* velocity;
  float* grad;
  int64_t count;
};

// Where one parameter's per-chunk gradient partials lie in a [chunks][stride] buffer and the
// gradient they are summed into. A per-iteration table of these lives in device memory.
struct PartialSlot {
  const float* partials;
  float* grad;
  int64_t count;   // elements of the gradient
  int64_t offset;  // of the first element within each chunk's stride
  int64_t stride;  // elements per chunk
  int64_t chunks;
};

}  // namespace mlp

// Kernel entry points (global namespace and C++ linkage). Compiled by nvcc (mlp_kernels.cu)
// they are declared __global__, elsewhere as the plain functions their host stubs are.
#if defined(__CUDACC__)
#define MLP_GLOBAL __global__
#else
#define MLP_GLOBAL
#endif

// The linear layers' kernels take their widths as template arguments, so that the per-row
// loops have constant bounds (unrolled and vectorised on a CPU, registers on a GPU). Each
// instantiation is its own kernel, as with nvcc; mlp_kernels_sim.cpp / .cu instantiate the
// shapes the model uses.
//
// y[r][o] = b[o] + sum_i x[r][i] * w[i][o]; one thread per row.
template <int In, int Out>
MLP_GLOBAL void mlp_linear_forward(const float* x, const float* w, const float* b, float* y,
                                   int64_t rows);
// dx[r][i] = sum_o dy[r][o] * w[i][o]; one thread per row.
template <int In, int Out>
MLP_GLOBAL void mlp_linear_backward_data(const float* dy, const float* w, float* dx,
                                         int64_t rows);
// Per-chunk weight and bias gradient partials: partials[c][i][o] = sum over the chunk's rows
// of x[r][i] * dy[r][o], with i == In standing for the bias (x = 1). One thread per (c, i).
template <int In, int Out>
MLP_GLOBAL void mlp_linear_backward_weight_partials(const float* x, const float* dy,
                                                    float* partials, int64_t rows,
                                                    int64_t chunk_rows);
// Elementwise activations and their backward passes: each thread handles kElementsPerThread
// consecutive elements (threads = ceil(count / kElementsPerThread)).
MLP_GLOBAL void mlp_leaky_relu_forward(const float* x, float* y, int64_t count);
MLP_GLOBAL void mlp_leaky_relu_backward(const float* dy, const float* x, float* dx,
                                        int64_t count);
MLP_GLOBAL void mlp_softsign_forward(const float* x, float* y, int64_t count);
MLP_GLOBAL void mlp_softsign_backward(const float* dy, const float* x, float* dx,
                                      int64_t count);
// Mean squared error, one thread per chunk: dp = (p - y) * grad_scale, and the chunk's sum of
// squared errors into loss_partials[c].
MLP_GLOBAL void mlp_mse_loss(const float* p, const float* y, float* dp, float* loss_partials,
                             int64_t rows, int64_t chunk_rows, float grad_scale);
// loss[0] = (sum of loss_partials in chunk order) * inv_rows; one thread.
MLP_GLOBAL void mlp_loss_reduce(const float* loss_partials, int64_t chunks, float inv_rows,
                                float* loss);
// For each slot of table[first, first + count): grad[e] += sum over chunks of its partials, in
// chunk order. One thread per gradient element across the slots (total of them).
MLP_GLOBAL void mlp_reduce_partials(const mlp::PartialSlot* table, int first, int count,
                                    int64_t total);
// SGD with momentum over table[first, first + count): v = mu * v + g; w = w - lr * v.
MLP_GLOBAL void mlp_sgd_momentum(const mlp::ParamSlot* table, int first, int count,
                                 int64_t total, float lr, float mu);
// out[0] = sqrt(sum of g * g over all slots, in table order); one thread.
MLP_GLOBAL void mlp_grad_norm(const mlp::ParamSlot* table, int count, float* out);
