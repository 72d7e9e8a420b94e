// Layout T: W stored (K, M) row-major, y[m] = sum_k W[k, m] x[k] (BLAS 'T', i.e. x @ W).
//
// Each thread owns 16 bytes of consecutive outputs (VW columns) and walks K; CB threads span the
// columns of a block (one warp reads 512 contiguous bytes of a row), and THREADS / CB slices of
// the block split K, meeting in shared memory in a fixed order. UNROLL rows are in flight per
// thread; PIPE issues the next step's UNROLL rows before the current step's math, as the
// row-major kernel does, so a thread always has loads in flight. Split-K across blocks as in the
// row-major kernel.
//
// PIPE with several vectors (NV > 1) stages x in shared memory as fp32, the NV vectors of a row
// side by side (one 16-byte shared load gives a row's x for four vectors), kXRows rows at a time.
// Each chunk's first W loads are issued before its x is staged. Its blocks are held to a
// register budget that keeps 1024 threads on an SM (512 for 16-bit W, whose 16 bytes are twice the
// columns): at short K the whole grid is then resident at once, where one block fewer an SM left
// a second wave (H200, fp32 65536x256 batch 4, 256 threads: 20.5 us at 79 registers, 17.5 at
// 64; benchmarks/NOTES.md).
#pragma once

#include "common.cuh"

namespace gemvx {
namespace kernels {

// Rows of x a staged chunk holds (PIPE, NV > 1): 16 KiB of shared memory.
template <int NV>
inline constexpr int kXRows = 4096 / NV;

// Threads the staged kernels' register budget keeps on an SM: 1024 (64 registers each), 512
// where 16 bytes of W hold eight columns (twice the sums).
template <typename T, bool VEC>
inline constexpr int kStagedThreadsPerSm = kVecWidth<T, VEC> > 4 ? 512 : 1024;

// The least blocks per SM of __launch_bounds__: the staged kernels' budget; 0 (no bound) for the
// other kernels.
template <typename T, int THREADS, int NV, bool PIPE, bool VEC>
inline constexpr int kTransposedMinBlocks =
    !PIPE || NV == 1 ? 0 : (kStagedThreadsPerSm<T, VEC> > THREADS ? kStagedThreadsPerSm<T, VEC> / THREADS : 1);

template <typename T, int THREADS, int CB, int U, int NV, bool PIPE, bool VEC>
__global__ void __launch_bounds__(THREADS, (kTransposedMinBlocks<T, THREADS, NV, PIPE, VEC>))
    gemv_transposed(const Args a) {
  constexpr bool STAGED = PIPE && NV > 1;
  static_assert(!STAGED || NV % 4 == 0, "pipelined transposed configs take one vector or 4n");
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

  if constexpr (STAGED) {
    constexpr int XR = kXRows<NV>;
    __shared__ __align__(16) float xs[XR * NV];  // xs[r * NV + v] = x_v[c0 + r]
    // acc[v][i] += W[row][m0 + i] x_v[row], wf = the row's VW elements, r = row - c0.
    auto fma_staged = [&](const float (&wf)[VW], int r) {
#pragma unroll
      for (int q = 0; q < NV / 4; ++q) {
        const float4 x4 = reinterpret_cast<const float4*>(xs + r * NV)[q];
        const float xq[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int i = 0; i < VW; ++i) acc[4 * q + j][i] = fmaf(wf[i], xq[j], acc[4 * q + j][i]);
      }
    };
    auto fma_chunk = [&](const Chunk& w, int r) {
      float wf[VW];
      unpack<T>(w, wf);
      fma_staged(wf, r);
    };
    const bool body = m0 + VW <= a.M;  // the thread's whole 16 bytes lie inside W
#pragma unroll 1
    for (int64_t c0 = k_begin; c0 < k_end; c0 += XR) {
      // Rows from c0: r (32 bits) indexes the chunk's rows, of W, x and xs alike.
      const int rows = int(min(int64_t(XR), k_end - c0));
      const T* wc = W + c0 * a.ldw + m0;
      auto load_row = [&](int r) { return load_stream(reinterpret_cast<const Chunk*>(wc + r * a.ldw)); };
      int r = ks;
      const bool steps = body && r + (U - 1) * KS < rows;
      Chunk w[U];
      if (steps) {
#pragma unroll
        for (int u = 0; u < U; ++u) w[u] = load_row(r + u * KS);
      }
      // Stage x: a row of each vector a thread and round, the loads issued before the stores. The
      // vectors by a pointer stepped by x_vec (offsets v * x_vec, kept for every chunk, spilled).
      const T* xc = X + c0;
#pragma unroll 1
      for (int e = threadIdx.x; e < rows; e += THREADS) {
        float f[NV];
        const T* xe = xc + e;
#pragma unroll
        for (int v = 0; v < NV; ++v, xe += a.x_vec) f[v] = v < nv ? to_float(load_keep(xe)) : 0.0f;
#pragma unroll
        for (int q = 0; q < NV / 4; ++q)
          reinterpret_cast<float4*>(xs + e * NV)[q] = make_float4(f[4 * q], f[4 * q + 1], f[4 * q + 2], f[4 * q + 3]);
      }
      __syncthreads();
      if (steps) {
        // The next step's rows by a stepped pointer (no 64-bit product a load).
        const int64_t row_step = int64_t(KS) * a.ldw;
        const T* p = wc + (r + U * KS) * a.ldw;
#pragma unroll 1
        for (r += U * KS; r + (U - 1) * KS < rows; r += U * KS, p += U * row_step) {
          Chunk wn[U];
#pragma unroll
          for (int u = 0; u < U; ++u) wn[u] = load_stream(reinterpret_cast<const Chunk*>(p + u * row_step));
#pragma unroll
          for (int u = 0; u < U; ++u) fma_chunk(w[u], r + (u - U) * KS);
#pragma unroll
          for (int u = 0; u < U; ++u) w[u] = wn[u];
        }
#pragma unroll
        for (int u = 0; u < U; ++u) fma_chunk(w[u], r + (u - U) * KS);
      }
      if (body) {
        for (; r < rows; r += KS) fma_chunk(load_row(r), r);
      } else if (m0 < a.M) {
        // Right edge, fewer than VW columns left: element loads of the columns that exist.
        for (; r < rows; r += KS) {
          float wf[VW];
#pragma unroll
          for (int i = 0; i < VW; ++i) wf[i] = m0 + i < a.M ? to_float(wc[r * a.ldw + i]) : 0.0f;
          fma_staged(wf, r);
        }
      }
      __syncthreads();  // every row of xs read before the next chunk is staged
    }
  } else {
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
