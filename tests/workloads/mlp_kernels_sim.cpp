// The train-mlp kernels on cudasim: each kernel name of mlp_kernels.h is defined as a host stub
// (the symbol the program passes to cudaLaunchKernel) and registered, before main, with a body
// that runs the kernel's per-thread code (mlp_kernel_math.h) for every logical thread of the
// launch. Registering from a static constructor is what nvcc's generated code does
// (__cudaRegisterFunction), so the training program needs no cudasim-specific call.
//
// The body runs on the worker thread of the launch's stream and loops over the logical threads
// in order; each thread's result is independent of that order (see mlp_kernel_math.h), so a
// GPU running them in parallel computes the same bytes.
#include <cudasim/cudasim.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>

#include "mlp_kernel_math.h"

namespace {

// A stub is only an address: calling it directly is a programming error (as calling a
// __global__ function without <<<>>> would be). Each stub passes its own name, which also
// keeps identical-code folding from giving two kernels one address.
[[noreturn]] void stub_called(const char* name) {
  std::fprintf(stderr, "train-mlp: kernel %s was called directly instead of launched\n", name);
  std::abort();
}

template <typename F>
struct KernelTraits;

template <typename... A>
struct KernelTraits<void (*)(A...)> {
  using Args = std::tuple<A...>;
  static constexpr int kCount = static_cast<int>(sizeof...(A));
  static constexpr size_t kSizes[sizeof...(A)] = {sizeof(A)...};
};

template <auto Thread, typename Args, size_t... I>
void run_threads(void** params, int64_t threads, std::index_sequence<I...>) {
  // params[i] points to cudasim's copy of argument i, taken at launch.
  const Args args{*static_cast<std::tuple_element_t<I, Args>*>(params[I])...};
  for (int64_t t = 0; t < threads; ++t) Thread(t, std::get<I>(args)...);
}

// The body cudasim runs for a launch of Stub: Thread(t, args...) for every logical thread t.
template <auto Stub, auto Thread>
void kernel_body(void** params, dim3 grid, dim3 block) {
  using Traits = KernelTraits<decltype(Stub)>;
  const int64_t threads = static_cast<int64_t>(grid.x) * grid.y * grid.z *
                          (static_cast<int64_t>(block.x) * block.y * block.z);
  run_threads<Thread, typename Traits::Args>(params, threads,
                                             std::make_index_sequence<Traits::kCount>());
}

template <auto Stub, auto Thread>
void register_kernel(const char* name) {
  using Traits = KernelTraits<decltype(Stub)>;
  cudasimRegisterKernel(reinterpret_cast<const void*>(Stub), name, &kernel_body<Stub, Thread>,
                        Traits::kCount, Traits::kSizes);
}

}  // namespace

// __PRETTY_FUNCTION__ names the instantiation, so each one's body differs from the others'.
template <int In, int Out>
void mlp_linear_forward(const float*, const float*, const float*, float*, int64_t) {
  stub_called(__PRETTY_FUNCTION__);
}
template <int In, int Out>
void mlp_linear_backward_data(const float*, const float*, float*, int64_t) {
  stub_called(__PRETTY_FUNCTION__);
}
template <int In, int Out>
void mlp_linear_backward_weight_partials(const float*, const float*, float*, int64_t, int64_t) {
  stub_called(__PRETTY_FUNCTION__);
}
// The shapes train_mlp.cpp uses; a shape missing here fails its launch
// (cudaErrorInvalidDeviceFunction), as a kernel missing from a fatbinary would.
template void mlp_linear_forward<8, 16>(const float*, const float*, const float*, float*, int64_t);
template void mlp_linear_forward<16, 16>(const float*, const float*, const float*, float*, int64_t);
template void mlp_linear_forward<16, 1>(const float*, const float*, const float*, float*, int64_t);
template void mlp_linear_backward_data<8, 16>(const float*, const float*, float*, int64_t);
template void mlp_linear_backward_data<16, 16>(const float*, const float*, float*, int64_t);
template void mlp_linear_backward_data<16, 1>(const float*, const float*, float*, int64_t);
template void mlp_linear_backward_weight_partials<8, 16>(const float*, const float*, float*,
                                                         int64_t, int64_t);
template void mlp_linear_backward_weight_partials<16, 16>(const float*, const float*, float*,
                                                          int64_t, int64_t);
template void mlp_linear_backward_weight_partials<16, 1>(const float*, const float*, float*,
                                                         int64_t, int64_t);

void mlp_leaky_relu_forward(const float*, float*, int64_t) {
  stub_called("mlp_leaky_relu_forward");
}
void mlp_leaky_relu_backward(const float*, const float*, float*, int64_t) {
  stub_called("mlp_leaky_relu_backward");
}
void mlp_softsign_forward(const float*, float*, int64_t) { stub_called("mlp_softsign_forward"); }
void mlp_softsign_backward(const float*, const float*, float*, int64_t) {
  stub_called("mlp_softsign_backward");
}
void mlp_mse_loss(const float*, const float*, float*, float*, int64_t, int64_t, float) {
  stub_called("mlp_mse_loss");
}
void mlp_loss_reduce(const float*, int64_t, float, float*) { stub_called("mlp_loss_reduce"); }
void mlp_reduce_partials(const mlp::PartialSlot*, int, int, int64_t) {
  stub_called("mlp_reduce_partials");
}
void mlp_sgd_momentum(const mlp::ParamSlot*, int, int, int64_t, float, float) {
  stub_called("mlp_sgd_momentum");
}
void mlp_grad_norm(const mlp::ParamSlot*, int, float*) { stub_called("mlp_grad_norm"); }

namespace {

template <int In, int Out>
void register_linear() {
  const std::string shape = "<" + std::to_string(In) + ", " + std::to_string(Out) + ">";
  register_kernel<&mlp_linear_forward<In, Out>, &mlp::linear_forward_thread<In, Out>>(
      ("mlp_linear_forward" + shape).c_str());
  register_kernel<&mlp_linear_backward_data<In, Out>, &mlp::linear_backward_data_thread<In, Out>>(
      ("mlp_linear_backward_data" + shape).c_str());
  register_kernel<&mlp_linear_backward_weight_partials<In, Out>,
                  &mlp::linear_backward_weight_partials_thread<In, Out>>(
      ("mlp_linear_backward_weight_partials" + shape).c_str());
}

// Runs before main, like nvcc's registration constructors.
[[gnu::constructor]] void register_mlp_kernels() {
  register_linear<8, 16>();
  register_linear<16, 16>();
  register_linear<16, 1>();
  register_kernel<&mlp_leaky_relu_forward, &mlp::leaky_relu_forward_thread>(
      "mlp_leaky_relu_forward");
  register_kernel<&mlp_leaky_relu_backward, &mlp::leaky_relu_backward_thread>(
      "mlp_leaky_relu_backward");
  register_kernel<&mlp_softsign_forward, &mlp::softsign_forward_thread>("mlp_softsign_forward");
  register_kernel<&mlp_softsign_backward, &mlp::softsign_backward_thread>(
      "mlp_softsign_backward");
  register_kernel<&mlp_mse_loss, &mlp::mse_loss_thread>("mlp_mse_loss");
  register_kernel<&mlp_loss_reduce, &mlp::loss_reduce_thread>("mlp_loss_reduce");
  register_kernel<&mlp_reduce_partials, &mlp::reduce_partials_thread>("mlp_reduce_partials");
  register_kernel<&mlp_sgd_momentum, &mlp::sgd_momentum_thread>("mlp_sgd_momentum");
  register_kernel<&mlp_grad_norm, &mlp::grad_norm_thread>("mlp_grad_norm");
}

}  // namespace
