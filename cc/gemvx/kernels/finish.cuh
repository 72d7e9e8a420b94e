// Second pass of split-K: y = alpha * sum_s ws[s] + beta * y_in, adding the splits in a fixed
// order (bitwise reproducible, no atomics). With splits == 0 it is the K == 0 case: y = beta*y_in.
#pragma once

#include "common.cuh"

namespace gemvx {
namespace kernels {

template <typename T>
__global__ void __launch_bounds__(256) finish(const Args a) {
  const int64_t per_split = a.groups * a.nvec * a.M;
  const bool one_vector = a.groups * a.nvec == 1;  // o is the row: no divisions
  pdl_wait();
  pdl_trigger();
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < per_split;
       o += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int q = 0; q < a.splits; ++q) s += a.ws[q * per_split + o];
    int64_t m = o, v = 0, g = 0;
    if (!one_vector) {
      m = o % a.M;
      const int64_t gv = o / a.M;
      v = gv % a.nvec;
      g = gv / a.nvec;
    }
    store_final<T>(a, g, v, m, s);
  }
}

}  // namespace kernels
}  // namespace gemvx
