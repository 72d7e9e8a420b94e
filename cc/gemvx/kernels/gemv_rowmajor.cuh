// Layout N: W is (M, K) row-major, y[m] = dot(W[m, :], x).
//
// TPR lanes share a row and walk K in 16-byte chunks (lane l reads chunks l, l+TPR, ...), so a
// warp's loads are contiguous. Each thread owns R rows and issues UNROLL x R stream loads of W
// per step. PIPE software-pipelines the steps in registers: the next step's loads of W (one
// vector: and of x) are issued before the current step's math, so they stay in flight whatever
// order ptxas picks (without it, ptxas sometimes interleaves loads with math;
// scripts/check_sass.py). Several vectors read their x chunks in the math (L1 hits after a block's
// first rows), which keeps the registers for the R x NV sums.
// Partial sums meet in a shuffle (and, for TPR > 32, one shared-memory step in fixed order, so
// results are bitwise reproducible). PIPE's vectors within one warp meet in a reduce-scatter:
// log2(TPR) halvings leave each lane the sums of NV / TPR vectors of its R rows (about R x NV
// shuffles, against R x NV x log2(TPR) for every sum in every lane), which it stores.
// With split-K, blockIdx.y selects a contiguous K range and the partial sums go to the workspace;
// finish.cuh adds them in order.
//
// P is the argument block: Args, or LeanArgs for one plain GEMV (one vector, one matrix, no
// split, K a whole number of 16-byte chunks, 32-bit sizes; the Lean configs). The lean
// variant reads its fields from one 64-byte line of the constant bank and indexes with 32-bit
// integers: 26 SASS instructions before the first load instead of 148 (fp16, config 63 against
// its twin 86), 9-13% less time per call at W of 0.5-2 MiB on an H100 (benchmarks/NOTES.md,
// "The lean argument block"). The lean variant also loads a lane's last chunks (fewer than U)
// together instead of one at a time: at K of 2-3 chunks a lane, one load's latency instead of two
// or three (NOTES, "The lean tail").
#pragma once

#include "common.cuh"

namespace gemvx {
namespace kernels {

template <typename T, int THREADS, int TPR, int R, int U, int NV, bool PIPE, bool VEC, typename P = Args>
__global__ void __launch_bounds__(THREADS) gemv_rowmajor(const __grid_constant__ P a) {
  static_assert(THREADS % TPR == 0 && (TPR & (TPR - 1)) == 0, "TPR must be a power of two");
  constexpr bool LEAN = std::is_same_v<P, LeanArgs>;
  static_assert(!LEAN || (NV == 1 && VEC), "LeanArgs: one vector, 16-byte loads");
  using I = std::conditional_t<LEAN, int, int64_t>;  // rows and K chunks
  constexpr int VW = kVecWidth<T, VEC>;
  using Chunk = Raw<T, VEC>;
  constexpr int GROUPS = THREADS / TPR;  // row groups per block
  constexpr int ROWS = GROUPS * R;       // rows per block
  constexpr int WARP_TPR = TPR < 32 ? TPR : 32;
  constexpr int WARPS_PER_ROW = TPR / WARP_TPR;

  if constexpr (NV == 1 && !LEAN) {
    if (a.prefetch_blocks != 0) rowmajor_start<T, ROWS, (PIPE ? 2 : 1) * U * TPR, VEC>(&a);
  }
  const int lane = threadIdx.x % TPR;
  const int grp = threadIdx.x / TPR;
  const BlockWork<T, NV, P> bw(a);
  const int split = bw.split, nv = bw.nv;
  const int64_t g = bw.g, v0 = bw.v0;
  const T* const W = bw.W;
  const T* const X = bw.X;

  // Rows past M load the last row (in bounds, never stored): no predicate in the hot loop.
  I row[R];
  const T* wrow[R];
#pragma unroll
  for (int j = 0; j < R; ++j) {
    row[j] = I(blockIdx.x) * ROWS + grp + I(j) * GROUPS;
    if constexpr (LEAN)
      wrow[j] = W + size_t(unsigned(row[j] < a.M ? row[j] : a.M - 1)) * unsigned(a.ldw);
    else
      wrow[j] = W + (row[j] < a.M ? row[j] : a.M - 1) * a.ldw;
  }
  // Vectors past nvec alias the last valid one (in bounds, never stored).
  const T* xv[NV];
  if constexpr (LEAN) {
    xv[0] = X;
  } else {
#pragma unroll
    for (int v = 0; v < NV; ++v) xv[v] = X + int64_t(v < nv ? v : nv - 1) * a.x_vec;
  }

  I c_begin, c_end;
  [[maybe_unused]] int64_t nchunk;
  if constexpr (LEAN) {
    c_begin = 0;
    c_end = int(unsigned(a.K) / VW);
  } else {
    nchunk = a.K / VW;
    c_begin = min(int64_t(split) * a.split_span, nchunk);
    c_end = min(c_begin + a.split_span, nchunk);
  }
  pdl_wait();  // after the index arithmetic (kernel parameters only), before any global access

  float acc[R][NV];
#pragma unroll
  for (int j = 0; j < R; ++j)
#pragma unroll
    for (int v = 0; v < NV; ++v) acc[j][v] = 0.0f;

  auto fma_chunk = [&](const Chunk (&w)[R], const Chunk (&xc)[NV]) {
    float wf[R][VW];
#pragma unroll
    for (int j = 0; j < R; ++j) unpack<T>(w[j], wf[j]);
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      float xf[VW];
      unpack<T>(xc[v], xf);
#pragma unroll
      for (int j = 0; j < R; ++j)
#pragma unroll
        for (int i = 0; i < VW; ++i) acc[j][v] = fmaf(wf[j][i], xf[i], acc[j][v]);
    }
  };

  I c = c_begin + lane;
  if constexpr (PIPE) {
    // One vector: x's chunks are loaded a step ahead with W's. Several: x's chunks are read in the
    // math, and the registers go to the R x NV sums.
    constexpr bool X_AHEAD = NV == 1;
    auto load_step = [&](Chunk (&w)[U][R], Chunk (&xc)[U][NV], I c0) {
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int j = 0; j < R; ++j)
          w[u][j] = load_stream(reinterpret_cast<const Chunk*>(wrow[j]) + c0 + u * TPR);
      if constexpr (X_AHEAD) {
#pragma unroll
        for (int u = 0; u < U; ++u)
          xc[u][0] = load_keep(reinterpret_cast<const Chunk*>(xv[0]) + c0 + u * TPR);
      }
    };
    auto math = [&](const Chunk (&w)[U][R], const Chunk (&xc)[U][NV], I c0) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if constexpr (X_AHEAD) {
          fma_chunk(w[u], xc[u]);
        } else {
          Chunk xs[NV];
#pragma unroll
          for (int v = 0; v < NV; ++v) xs[v] = load_keep(reinterpret_cast<const Chunk*>(xv[v]) + c0 + u * TPR);
          fma_chunk(w[u], xs);
        }
      }
    };
    if (c + (U - 1) * TPR < c_end) {
      Chunk w[U][R];
      Chunk xc[U][NV];
      load_step(w, xc, c);
#pragma unroll 1
      for (c += U * TPR; c + (U - 1) * TPR < c_end; c += U * TPR) {
        Chunk wn[U][R];
        Chunk xn[U][NV];
        load_step(wn, xn, c);
        math(w, xc, c - U * TPR);
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
          for (int j = 0; j < R; ++j) w[u][j] = wn[u][j];
          if constexpr (X_AHEAD) xc[u][0] = xn[u][0];
        }
      }
      math(w, xc, c - U * TPR);
    }
  } else {
    // The loads are written out here rather than through load_step: the shared lambda changes
    // ptxas's schedule of several unpipelined kernels (checked by SASS diff), and this is the
    // code the table was measured with.
    for (; c + (U - 1) * TPR < c_end; c += U * TPR) {
      Chunk w[U][R];
      Chunk xc[U][NV];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int j = 0; j < R; ++j)
          w[u][j] = load_stream(reinterpret_cast<const Chunk*>(wrow[j]) + c + u * TPR);
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int v = 0; v < NV; ++v)
          xc[u][v] = load_keep(reinterpret_cast<const Chunk*>(xv[v]) + c + u * TPR);
#pragma unroll
      for (int u = 0; u < U; ++u) fma_chunk(w[u], xc[u]);
    }
  }
  if constexpr (LEAN) {
    // Fewer than U chunks of the lane are left: issue all their loads before any math, as the
    // steps above do (a loop of single loads waits out one load's latency per chunk, most of the
    // kernel's time when a lane's whole share of K is two or three chunks).
    if (c < c_end) {
      Chunk w[U][R];
      Chunk xc[U][NV];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (c + u * TPR < c_end) {
#pragma unroll
          for (int j = 0; j < R; ++j)
            w[u][j] = load_stream(reinterpret_cast<const Chunk*>(wrow[j]) + c + u * TPR);
          xc[u][0] = load_keep(reinterpret_cast<const Chunk*>(xv[0]) + c + u * TPR);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (c + u * TPR < c_end) fma_chunk(w[u], xc[u]);
    }
  } else {
    for (; c < c_end; c += TPR) {
      Chunk w[R];
      Chunk xc[NV];
#pragma unroll
      for (int j = 0; j < R; ++j) w[j] = load_stream(reinterpret_cast<const Chunk*>(wrow[j]) + c);
#pragma unroll
      for (int v = 0; v < NV; ++v) xc[v] = load_keep(reinterpret_cast<const Chunk*>(xv[v]) + c);
      fma_chunk(w, xc);
    }
  }
  pdl_trigger();
  // Scalar tail (K % VW elements), done once, by the last split (LeanArgs: K % VW == 0).
  if constexpr (VEC && !LEAN) {
    if (split == a.splits - 1) {
      for (int64_t k = nchunk * VW + lane; k < a.K; k += TPR) {
#pragma unroll
        for (int v = 0; v < NV; ++v) {
          const float xf = to_float(xv[v][k]);
#pragma unroll
          for (int j = 0; j < R; ++j) acc[j][v] = fmaf(to_float(wrow[j][k]), xf, acc[j][v]);
        }
      }
    }
  }

  if constexpr (PIPE && NV > 1 && WARPS_PER_ROW == 1) {
    // Reduce-scatter over the row's lanes: at each halving (lane bit o) a lane keeps half of its
    // vectors, the upper half if its bit is set, and adds its partner's partial sums of them; it
    // ends with vectors vbase .. vbase + NF - 1 of all its rows. Once one vector is left (NV <
    // TPR), the remaining halvings add the pair's sums, and the SAME lanes that hold them alike
    // leave the store to the first. Each sum is a + b of the pair in either order: bitwise the
    // same in both lanes and from run to run.
    int vbase = 0;
    int n = NV;
#pragma unroll
    for (int o = WARP_TPR / 2; o > 0; o /= 2) {
      const bool hi = (lane & o) != 0;
      if (n > 1) {
        const int h = n / 2;
#pragma unroll
        for (int i = 0; i < NV / 2; ++i) {
          if (i < h) {
#pragma unroll
            for (int j = 0; j < R; ++j) {
              const float send = hi ? acc[j][i] : acc[j][i + h];
              const float keep = hi ? acc[j][i + h] : acc[j][i];
              acc[j][i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
            }
          }
        }
        if (hi) vbase += h;
        n = h;
      } else {
#pragma unroll
        for (int j = 0; j < R; ++j) acc[j][0] += __shfl_xor_sync(0xffffffffu, acc[j][0], o);
      }
    }
    constexpr int NF = NV / WARP_TPR > 0 ? NV / WARP_TPR : 1;
    constexpr int SAME = NV < WARP_TPR ? WARP_TPR / NV : 1;  // lanes holding the same vectors
    if (lane % SAME == 0) {
#pragma unroll
      for (int j = 0; j < R; ++j)
#pragma unroll
        for (int i = 0; i < NF; ++i)
          if (row[j] < a.M && vbase + i < nv)
            store_output<T>(a, split, g, v0 + vbase + i, int64_t(row[j]), acc[j][i]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < R; ++j)
#pragma unroll
      for (int v = 0; v < NV; ++v) acc[j][v] = group_sum<WARP_TPR>(acc[j][v]);

    if constexpr (WARPS_PER_ROW > 1) {
      // One partial per warp; the row's first warp adds them in a fixed order.
      __shared__ float red[GROUPS][WARPS_PER_ROW][R * NV];
      const int wi = lane / 32;
      if (lane % 32 == 0) {
#pragma unroll
        for (int j = 0; j < R; ++j)
#pragma unroll
          for (int v = 0; v < NV; ++v) red[grp][wi][j * NV + v] = acc[j][v];
      }
      __syncthreads();
      if (wi != 0) return;
#pragma unroll
      for (int j = 0; j < R; ++j)
#pragma unroll
        for (int v = 0; v < NV; ++v) {
          float s = 0.0f;
#pragma unroll
          for (int q = 0; q < WARPS_PER_ROW; ++q) s += red[grp][q][j * NV + v];
          acc[j][v] = s;
        }
    }

    // Every lane holds the totals; spread the R x NV stores over the lanes.
#pragma unroll
    for (int j = 0; j < R; ++j)
#pragma unroll
      for (int v = 0; v < NV; ++v) {
        if (lane == (j * NV + v) % WARP_TPR && row[j] < a.M && v < nv)
          store_output<T>(a, split, g, v0 + v, int64_t(row[j]), acc[j][v]);
      }
  }
}

}  // namespace kernels
}  // namespace gemvx
