// Layout T: W stored (K, M) row-major, y[m] = sum_k W[k, m] x[k] (BLAS 'T', i.e. x @ W).
//
// Each thread owns 16 bytes of consecutive outputs (VW columns) and walks K; CB threads span the
// columns of a block (one warp reads 512 contiguous bytes of a row), and THREADS / CB slices of
// the block split K, meeting in shared memory in a fixed order. UNROLL rows are in flight per
// thread; PIPE (single-vector configs) issues the next step's UNROLL rows before the current
// step's math, as the row-major kernel does, so a thread always has loads in flight. Split-K
// across blocks as in the row-major kernel.
#pragma once

#include "common.cuh"

namespace gemvx {
namespace kernels {

template <typename T, int THREADS, int CB, int U, int NV, bool PIPE, bool VEC>
__global__ void __launch_bounds__(THREADS) gemv_transposed(const Args a) {
  static_assert(!PIPE || NV == 1, "pipelined transposed configs take one vector");
  static_assert(THREADS % CB == 0, "CB must divide THREADS");
  constexpr int VW = kVecWidth<T, VEC>;
  using Chunk = Raw<T, VEC>;
  constexpr int KS = THREADS / CB;  // K slices per block

  const int ct = threadIdx.x % CB;
  const int ks = threadIdx.x / CB;
  const BlockWork<T, NV> bw(a);
  const int split = bw.split, nv = bw.nv;
  const int64_t g = bw.g, v0 = bw.v0;
  const T* const W = bw.W;
  const T* const X = bw.X;
  const T* xv[NV];
#pragma unroll
  for (int v = 0; v < NV; ++v) xv[v] = X + int64_t(v < nv ? v : nv - 1) * a.x_vec;

  const int64_t m0 = (int64_t(blockIdx.x) * CB + ct) * VW;
  const int64_t k_begin = min(int64_t(split) * a.split_span, a.K);
  const int64_t k_end = min(k_begin + a.split_span, a.K);
  pdl_wait();  // after the index arithmetic (kernel parameters only), before any global access

  float acc[NV][VW];
#pragma unroll
  for (int v = 0; v < NV; ++v)
#pragma unroll
    for (int i = 0; i < VW; ++i) acc[v][i] = 0.0f;

  auto fma_row = [&](const Chunk& w, const T (&xs)[NV]) {
    float wf[VW];
    unpack<T>(w, wf);
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      const float xf = to_float(xs[v]);
#pragma unroll
      for (int i = 0; i < VW; ++i) acc[v][i] = fmaf(wf[i], xf, acc[v][i]);
    }
  };

  if (m0 + VW <= a.M) {
    const T* wcol = W + m0;
    int64_t k = k_begin + ks;
    if constexpr (PIPE) {
      auto load_step = [&](Chunk (&w)[U], T (&xs)[U][NV], int64_t k0) {
#pragma unroll
        for (int u = 0; u < U; ++u)
          w[u] = load_stream(reinterpret_cast<const Chunk*>(wcol + (k0 + u * KS) * a.ldw));
#pragma unroll
        for (int u = 0; u < U; ++u) xs[u][0] = load_keep(xv[0] + k0 + u * KS);
      };
      if (k + (U - 1) * KS < k_end) {
        Chunk w[U];
        T xs[U][NV];
        load_step(w, xs, k);
#pragma unroll 1
        for (k += U * KS; k + (U - 1) * KS < k_end; k += U * KS) {
          Chunk wn[U];
          T xn[U][NV];
          load_step(wn, xn, k);
#pragma unroll
          for (int u = 0; u < U; ++u) fma_row(w[u], xs[u]);
#pragma unroll
          for (int u = 0; u < U; ++u) {
            w[u] = wn[u];
            xs[u][0] = xn[u][0];
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) fma_row(w[u], xs[u]);
      }
    }
    for (; !PIPE && k + (U - 1) * KS < k_end; k += U * KS) {
      Chunk w[U];
      T xs[U][NV];
#pragma unroll
      for (int u = 0; u < U; ++u)
        w[u] = load_stream(reinterpret_cast<const Chunk*>(wcol + (k + u * KS) * a.ldw));
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int v = 0; v < NV; ++v) xs[u][v] = load_keep(xv[v] + k + u * KS);
#pragma unroll
      for (int u = 0; u < U; ++u) fma_row(w[u], xs[u]);
    }
    for (; k < k_end; k += KS) {
      T xs[NV];
#pragma unroll
      for (int v = 0; v < NV; ++v) xs[v] = load_keep(xv[v] + k);
      fma_row(load_stream(reinterpret_cast<const Chunk*>(wcol + k * a.ldw)), xs);
    }
  } else if (m0 < a.M) {
    // Right edge, fewer than VW columns left: element loads of the columns that exist.
    for (int64_t k = k_begin + ks; k < k_end; k += KS) {
#pragma unroll
      for (int i = 0; i < VW; ++i) {
        if (m0 + i < a.M) {
          const float wf = to_float(W[k * a.ldw + m0 + i]);
#pragma unroll
          for (int v = 0; v < NV; ++v) acc[v][i] = fmaf(wf, to_float(xv[v][k]), acc[v][i]);
        }
      }
    }
  }

  pdl_trigger();
  if constexpr (KS == 1) {
#pragma unroll
    for (int v = 0; v < NV; ++v)
#pragma unroll
      for (int i = 0; i < VW; ++i)
        if (m0 + i < a.M && v < nv) store_output<T>(a, split, g, v0 + v, m0 + i, acc[v][i]);
  } else {
    // red[slice][i * CB + ct]: consecutive threads hit consecutive banks.
    __shared__ float red[KS][VW * CB];
    const int64_t col_base = int64_t(blockIdx.x) * CB * VW;
#pragma unroll
    for (int v = 0; v < NV; ++v) {
#pragma unroll
      for (int i = 0; i < VW; ++i) red[ks][i * CB + ct] = acc[v][i];
      __syncthreads();
      for (int e = threadIdx.x; e < VW * CB; e += THREADS) {
        float s = 0.0f;
#pragma unroll
        for (int q = 0; q < KS; ++q) s += red[q][e];
        const int64_t m = col_base + int64_t(e % CB) * VW + e / CB;
        if (m < a.M && v < nv) store_output<T>(a, split, g, v0 + v, m, s);
      }
      __syncthreads();
    }
  }
}

}  // namespace kernels
}  // namespace gemvx
