// The train-mlp kernels for real GPUs: the CUDA twin of mlp_kernels_sim.cpp. Each kernel of
// mlp_kernels.h is a __global__ function whose thread t = blockIdx.x * blockDim.x + threadIdx.x
// runs the same per-thread code (mlp_kernel_math.h) as the cudasim body does for its t, so both
// builds compute the same bytes and print the same checksum.
//
// Built by meson when the toolkit has nvcc (tests/workloads/meson.build) into train-mlp-cuda,
// the same as:
//   nvcc -std=c++17 -O3 -fmad=false -static-global-template-stub=false -c mlp_kernels.cu
//   g++ -std=c++20 -O2 -ffp-contract=off -I$CUDA_HOME/include -c train_mlp.cpp -o train_mlp.o
//   g++ train_mlp.o mlp_kernels.o -L$CUDA_HOME/lib64 -lcudart -o train-mlp-cuda
// (not yet run on a GPU, so the bit-for-bit claim is by construction, unverified;
// scripts/gpu-check runs it.) -static-global-template-stub=false: nvcc 13 makes the
// host stubs of __global__ templates static by default, and train_mlp.cpp links to them.
// -fmad=false is required: fused multiply-adds would round differently from the CPU build.
// (-prec-div and -prec-sqrt keep their IEEE defaults; do not add --use_fast_math.)
// train_mlp.cpp takes each kernel's address from the plain declarations in mlp_kernels.h, which
// are the host stubs nvcc generates and registers for the definitions below.
#include "mlp_kernel_math.h"

namespace {

__device__ __forceinline__ int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

}  // namespace

template <int In, int Out>
__global__ void mlp_linear_forward(const float* x, const float* w, const float* b, float* y,
                                   int64_t rows) {
  mlp::linear_forward_thread<In, Out>(thread_index(), x, w, b, y, rows);
}

template <int In, int Out>
__global__ void mlp_linear_backward_data(const float* dy, const float* w, float* dx,
                                         int64_t rows) {
  mlp::linear_backward_data_thread<In, Out>(thread_index(), dy, w, dx, rows);
}

template <int In, int Out>
__global__ void mlp_linear_backward_weight_partials(const float* x, const float* dy,
                                                    float* partials, int64_t rows,
                                                    int64_t chunk_rows) {
  mlp::linear_backward_weight_partials_thread<In, Out>(thread_index(), x, dy, partials, rows,
                                                       chunk_rows);
}

// The shapes train_mlp.cpp launches (as mlp_kernels_sim.cpp registers them).
template __global__ void mlp_linear_forward<8, 16>(const float*, const float*, const float*,
                                                   float*, int64_t);
template __global__ void mlp_linear_forward<16, 16>(const float*, const float*, const float*,
                                                    float*, int64_t);
template __global__ void mlp_linear_forward<16, 1>(const float*, const float*, const float*,
                                                   float*, int64_t);
template __global__ void mlp_linear_backward_data<8, 16>(const float*, const float*, float*,
                                                         int64_t);
template __global__ void mlp_linear_backward_data<16, 16>(const float*, const float*, float*,
                                                          int64_t);
template __global__ void mlp_linear_backward_data<16, 1>(const float*, const float*, float*,
                                                         int64_t);
template __global__ void mlp_linear_backward_weight_partials<8, 16>(const float*, const float*,
                                                                    float*, int64_t, int64_t);
template __global__ void mlp_linear_backward_weight_partials<16, 16>(const float*, const float*,
                                                                     float*, int64_t, int64_t);
template __global__ void mlp_linear_backward_weight_partials<16, 1>(const float*, const float*,
                                                                    float*, int64_t, int64_t);

__global__ void mlp_leaky_relu_forward(const float* x, float* y, int64_t count) {
  mlp::leaky_relu_forward_thread(thread_index(), x, y, count);
}

__global__ void mlp_leaky_relu_backward(const float* dy, const float* x, float* dx,
                                        int64_t count) {
  mlp::leaky_relu_backward_thread(thread_index(), dy, x, dx, count);
}

__global__ void mlp_softsign_forward(const float* x, float* y, int64_t count) {
  mlp::softsign_forward_thread(thread_index(), x, y, count);
}

__global__ void mlp_softsign_backward(const float* dy, const float* x, float* dx,
                                      int64_t count) {
  mlp::softsign_backward_thread(thread_index(), dy, x, dx, count);
}

__global__ void mlp_mse_loss(const float* p, const float* y, float* dp, float* loss_partials,
                             int64_t rows, int64_t chunk_rows, float grad_scale) {
  mlp::mse_loss_thread(thread_index(), p, y, dp, loss_partials, rows, chunk_rows, grad_scale);
}

__global__ void mlp_loss_reduce(const float* loss_partials, int64_t chunks, float inv_rows,
                                float* loss) {
  mlp::loss_reduce_thread(thread_index(), loss_partials, chunks, inv_rows, loss);
}

__global__ void mlp_reduce_partials(const mlp::PartialSlot* table, int first, int count,
                                    int64_t total) {
  mlp::reduce_partials_thread(thread_index(), table, first, count, total);
}

__global__ void mlp_sgd_momentum(const mlp::ParamSlot* table, int first, int count,
                                 int64_t total, float lr, float mu) {
  mlp::sgd_momentum_thread(thread_index(), table, first, count, total, lr, mu);
}

__global__ void mlp_grad_norm(const mlp::ParamSlot* table, int count, float* out) {
  mlp::grad_norm_thread(thread_index(), table, count, out);
}
