// Second pass of split-K: y = alpha * sum_s ws[s] + beta * y_in, adding the splits in a fixed
// order (bitwise reproducible, no atomics). With splits == 0 it is the K == 0 case: y = beta*y_in.
// On Hopper, 2..8 splits add up inside the GEMV kernel instead (cluster_finish in common.cuh, the
// same additions in the same order).
#pragma once

#include "common.cuh"

namespace gemvx {
namespace kernels {

template <typename T>
__global__ void __launch_bounds__(256) finish(const Args a) {
  pdl_wait();
  pdl_trigger();
  const int64_t per_split = a.groups * a.nvec * a.M;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < per_split;
       o += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int q = 0; q < a.splits; ++q) s += a.ws[q * per_split + o];
    const int64_t m = o % a.M;
    const int64_t gv = o / a.M;
    write_y<T>(a, gv / a.nvec, gv % a.nvec, m, s);
  }
}

}  // namespace kernels
}  // namespace gemvx
