// Layout N, several vectors against one W, on tensor cores (fp16 / bf16, 16-byte body).
//
// y[v, m] = dot(W[m, :], x[v, :]) for up to 16 vectors is one small matrix product
// X (16 x K) . W^T (K x 8 rows), so each warp feeds it to mma.sync.m16n8k16 (fp32 accumulate):
// the A operand is 16 vectors of x, the B operand is 8 rows of W, D is 16 vectors x 8 rows.
// A dot product does not care in which order k is visited, as long as A and B agree; so each lane
// loads whole 16-byte chunks, exactly as the CUDA-core kernel does, and the k slots of the
// fragments are mapped onto those chunks:
//   lane (g = lane / 4, t = lane % 4) loads chunk (base + t) of W row g, and the same chunk of
//   x[g] and x[g + 8]; half h (0, 1) of the chunk is one mma, whose B registers are the chunk's
//   words 2h, 2h+1 and whose A registers are the matching words of x[g] and x[g + 8].
// Slot 2t (2t+8) of an mma thus always holds element 8*(base + t) + 4h (+2): the same k for every
// row of A and every column of B. The W loads and the row/split layout are those of the
// RowMajor family: P1 = TPR lanes share a row, i.e. WK = TPR / 4 warps split K (warp wk owns
// chunks 4wk..4wk+3 of each step) and meet in shared memory in a fixed order; the block's other
// warps (WR = warps / WK) take further rows at the same K, so they read the same x chunks at the
// same time (L1 hits: x costs 16 / rows-per-block of W's traffic). A warp owns P2 8-row tiles, so a
// block has THREADS / TPR * P2 rows, as in the RowMajor family. Split-K and the K % 8 tail work as
// in the CUDA-core kernel (the tail is added by the lane that stores the output).
// PIPE software-pipelines the steps: the next step's W and x loads are issued before this step's
// math.
// Vectors past nvec are zero rows of A. Operands without 16-byte alignment run the CUDA-core
// kernel with the same parameters instead (launch.cu).
// fp32 runs the same kernel on the tf32 tensor cores with fp32 accuracy ("3xTF32"): a 16-byte chunk
// is 4 elements, lane (g, t) holds k slots t and t + 4 of mma.m16n8k8 in elements 2h and 2h + 1 of
// its chunk (h = 0, 1: two mma per chunk, the same k for every row of A and column of B, as above),
// and every value v is split into big = v with its low 13 mantissa bits cleared (a tf32) and
// small = v - big (exact), itself cut to a tf32. x.w = xs.wb + xb.ws + xb.wb: the two small terms
// go to a second accumulator, big.big to the first (added on the CUDA cores per chunk, see
// mma_chunk); what is dropped (xs.ws and small's own low bits) is below 2^-19 of |x.w|, under the
// fp32 tolerance, where one tf32 mma (2^-11) is not. The sums meet as big + small where big is
// finite; where it is not (an Inf or NaN among the inputs, whose small parts are NaN), big alone is
// the result, as the fp32 product would have it.
#pragma once

#include "common.cuh"

namespace gemvx {
namespace kernels {

__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1, __half) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1, __nv_bfloat16) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_1688_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// An fp32 value's bits as a tf32 pair big + small (see the top of the file).
struct Tf32Pair {
  uint32_t big, small;
};
__device__ __forceinline__ Tf32Pair split_tf32(uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Hopper converts to tf32 toward zero in one instruction (F2FP.TF32 .RZ): the same cut as the
  // mask below, and a NaN stays a NaN.
  uint32_t big, small;
  asm("cvt.rz.tf32.f32 %0, %1;" : "=r"(big) : "f"(__uint_as_float(v)));
  asm("cvt.rz.tf32.f32 %0, %1;" : "=r"(small) : "f"(__uint_as_float(v) - __uint_as_float(big)));
  return {big, small};
#else
  constexpr uint32_t kTf32 = 0xffffe000u;
  // A NaN whose payload lies only in the cut bits would become Inf: it is kept a (quiet) NaN.
  const uint32_t big = isnan(__uint_as_float(v)) ? v | 0x00400000u : v & kTf32;
  return {big, __float_as_uint(__uint_as_float(v) - __uint_as_float(big)) & kTf32};
#endif
}

// One x.w product of 3xTF32 for an mma.m16n8k8: the A fragment a (x) and the B fragment b0, b1 (W)
// as tf32 pairs; the big.big products into big, the two small terms into small.
__device__ __forceinline__ void mma_tf32x3(float (&big)[4], float (&small)[4], const Tf32Pair (&a)[4],
                                           const Tf32Pair& b0, const Tf32Pair& b1) {
  mma_1688_tf32(small, a[0].small, a[1].small, a[2].small, a[3].small, b0.big, b1.big);
  mma_1688_tf32(small, a[0].big, a[1].big, a[2].big, a[3].big, b0.small, b1.small);
  mma_1688_tf32(big, a[0].big, a[1].big, a[2].big, a[3].big, b0.big, b1.big);
}

// One 16-byte chunk of every tile's row against the chunk of x[g] (xa) and x[g + 8] (xb), into
// acc (fp32: the big.big products; the small terms into accs, unused for 16-bit types).
template <typename T, int TILES>
__device__ __forceinline__ void mma_chunk(float (&acc)[TILES][4], float (&accs)[TILES][4],
                                          const uint4 (&w)[TILES], const uint4& xa, const uint4& xb) {
  if constexpr (std::is_same<T, float>::value) {
    const uint32_t va[4] = {xa.x, xa.y, xa.z, xa.w}, vb[4] = {xb.x, xb.y, xb.z, xb.w};
    Tf32Pair a[4], b[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      a[e] = split_tf32(va[e]);
      b[e] = split_tf32(vb[e]);
    }
#pragma unroll
    for (int j = 0; j < TILES; ++j) {
      const uint32_t vw[4] = {w[j].x, w[j].y, w[j].z, w[j].w};
      Tf32Pair c[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) c[e] = split_tf32(vw[e]);
      // The chunk's big.big sum leaves the tensor cores at once: their fp32 accumulation drops
      // bits (toward zero) at every mma, which over a long row's chain of mma would reach 1e-3;
      // added here, the long sum rounds as the CUDA-core kernels' does. The small terms are
      // 2^-10 of it and stay on the tensor cores.
      float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int e0 = 2 * h, e1 = 2 * h + 1;  // k slots t and t + 4
        const Tf32Pair af[4] = {a[e0], b[e0], a[e1], b[e1]};
        mma_tf32x3(part, accs[j], af, c[e0], c[e1]);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[j][i] += part[i];
    }
  } else {
    const uint32_t a0[4] = {xa.x, xb.x, xa.y, xb.y};
    const uint32_t a1[4] = {xa.z, xb.z, xa.w, xb.w};
#pragma unroll
    for (int j = 0; j < TILES; ++j) {
      mma_16816(acc[j], a0, w[j].x, w[j].y, T{});
      mma_16816(acc[j], a1, w[j].z, w[j].w, T{});
    }
  }
}

// fp32: the big and small sums (N accumulators each, in registers) of mma_chunk as one (big alone
// where it is not finite).
template <typename T, int N>
__device__ __forceinline__ void join_tf32(float* acc, const float* accs) {
  if constexpr (std::is_same<T, float>::value) {
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (isfinite(acc[i])) acc[i] += accs[i];
  }
}

// The outputs of a tensor-core warp that owns WN outputs from m0 (rows of W in layout N, columns
// in layout T) and 16 vectors: lane (gq, t) holds vectors gq and gq + 8 at outputs 8j + 2t,
// 8j + 2t + 1 of each 8-output tile j (the mma.m16n8k16 accumulator layout, W as the B operand).
// f(j, i, v, m) is called for each of the lane's acc[j][i] with vector v < nv and output m < M.
template <int WN, typename F>
__device__ __forceinline__ void for_each_output(int nv, int64_t M, int64_t m0, F&& f) {
  const int lane = threadIdx.x % 32;
  const int gq = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < WN / 8; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int v = gq + (i >= 2 ? 8 : 0);
      const int64_t m = m0 + j * 8 + 2 * t + (i & 1);
      if (v < nv && m < M) f(j, i, v, m);
    }
}

// The epilogue of such a warp, vectors from v0: one store_output per element.
template <typename T, int WN>
__device__ __forceinline__ void store_tile(const Args& a, int split, int64_t g, int64_t v0, int nv,
                                           int64_t m0, const float (&acc)[WN / 8][4]) {
  for_each_output<WN>(nv, a.M, m0, [&](int j, int i, int v, int64_t m) {
    store_output<T>(a, split, g, v0 + v, m, acc[j][i]);
  });
}

// Whether a tile's outputs can leave through store_tile_rows: the final y (no split-K
// partials), beta = 0 (y_in not read), and every row of y (each vector's, each matrix's) starting
// on 16 bytes. The same for every block of a launch.
template <typename T>
__device__ __forceinline__ bool rows_storable(const Args& a) {
  const auto on16 = [](int64_t elems) { return (elems * int64_t(sizeof(T))) % 16 == 0; };
  return a.splits == 1 && a.beta == 0.0f && (reinterpret_cast<uintptr_t>(a.y) & 15u) == 0 &&
         (a.nvec <= 1 || on16(a.y_vec)) && (a.groups <= 1 || on16(a.y_group));
}

// store_tile for rows_storable calls, through `stage` (the warp's own 16 x (WN + 8) elements of
// shared memory, 16-byte aligned): the warp writes its outputs there as pairs (the 8 elements of
// padding per row put the 32 lanes' pairs in 32 different banks), then each lane stores 16-byte
// pieces of the 16 rows, so y receives whole 32-byte sectors instead of one partial sector per
// 8-byte group of lanes (a quarter of the L2 write requests).
template <typename T, int WN>
__device__ __forceinline__ void store_tile_rows(const Args& a, int64_t g, int64_t v0, int nv, int64_t m0,
                                                const float (&acc)[WN / 8][4], T* stage) {
  static_assert(WN % 8 == 0, "whole 16-byte pieces per row");
  constexpr int LD = WN + 8;  // elements per staged row
  const int lane = threadIdx.x % 32;
  const int gq = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < WN / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      union {
        T e[2];
        uint32_t u;
      } pair;
      pair.e[0] = from_float<T>(a.alpha * acc[j][2 * h]);
      pair.e[1] = from_float<T>(a.alpha * acc[j][2 * h + 1]);
      *reinterpret_cast<uint32_t*>(stage + (gq + 8 * h) * LD + 8 * j + 2 * t) = pair.u;
    }
  __syncwarp();
  T* y = static_cast<T*>(a.y) + g * a.y_group + v0 * a.y_vec + m0;
#pragma unroll
  for (int it = 0; it < (WN + 15) / 16; ++it) {
    const int idx = it * 32 + lane;
    const int v = idx / (WN / 8), c = idx % (WN / 8);
    const int64_t m = m0 + 8 * c;
    if ((WN % 16 != 0 && v >= 16) || v >= nv || m >= a.M) continue;
    const uint4 piece = *reinterpret_cast<const uint4*>(stage + v * LD + 8 * c);
    T* dst = y + v * a.y_vec + 8 * c;
    if (m + 8 <= a.M) {
      *reinterpret_cast<uint4*>(dst) = piece;
    } else {
      const T* e = reinterpret_cast<const T*>(&piece);
      for (int i = 0; i < int(a.M - m); ++i) dst[i] = e[i];
    }
  }
}

// The K % 8 elements of layout N after the last whole 16-byte chunk (from k = k0), added to a
// warp's tile (see for_each_output) by the lane that holds each output.
template <typename T, int WN>
__device__ __forceinline__ void add_k_tail(const Args& a, const T* W, const T* X, int nv, int64_t m0,
                                           int64_t k0, float (&acc)[WN / 8][4]) {
  for_each_output<WN>(nv, a.M, m0, [&](int j, int i, int v, int64_t m) {
    const T* wr = W + m * a.ldw;
    const T* xr = X + int64_t(v) * a.x_vec;
    for (int64_t k = k0; k < a.K; ++k) acc[j][i] = fmaf(to_float(wr[k]), to_float(xr[k]), acc[j][i]);
  });
}

template <typename T, int THREADS, int TPR, int TILES, int U, bool PIPE>
__global__ void __launch_bounds__(THREADS) gemv_mma(const Args a) {
  constexpr int NV = 16;
  constexpr int VW = 16 / sizeof(T);  // elements per 16-byte chunk
  constexpr int WARPS = THREADS / 32;
  constexpr int WK = TPR / 4;        // warps sharing rows, splitting K
  constexpr int WR = WARPS / WK;     // warps on different rows (sharing x through L1)
  constexpr int ROWS = 8 * WR * TILES;
  static_assert(THREADS % 32 == 0, "gemv_mma: whole warps");
  static_assert(TPR % 4 == 0 && WK >= 1 && WARPS % WK == 0, "gemv_mma: TPR = 4 x (warps along K)");
  pdl_wait();

  const int lane = threadIdx.x % 32;
  const int wk = (threadIdx.x / 32) % WK;
  const int wr = (threadIdx.x / 32) / WK;
  const int gq = lane / 4;  // row of the tile this lane loads; vector gq (and gq + 8) of x
  const int t = lane % 4;
  const BlockWork<T, NV> bw(a);
  const int split = bw.split, nv = bw.nv;
  const int64_t g = bw.g, v0 = bw.v0;
  const T* const W = bw.W;
  const T* const X = bw.X;
  const int64_t row0 = int64_t(blockIdx.x) * ROWS + wr * 8 * TILES;
  const uint4* wrow[TILES];
#pragma unroll
  for (int j = 0; j < TILES; ++j) {
    const int64_t r = row0 + j * 8 + gq;
    wrow[j] = reinterpret_cast<const uint4*>(W + (r < a.M ? r : a.M - 1) * a.ldw);
  }
  const bool has_a = gq < nv, has_b = gq + 8 < nv;
  const uint4* xa_p = reinterpret_cast<const uint4*>(X + int64_t(has_a ? gq : 0) * a.x_vec);
  const uint4* xb_p = reinterpret_cast<const uint4*>(X + int64_t(has_b ? gq + 8 : 0) * a.x_vec);
  const uint4 zero = make_uint4(0, 0, 0, 0);

  const int64_t nchunk = a.K / VW;
  const int64_t c_begin = min(int64_t(split) * a.split_span, nchunk);
  const int64_t c_end = min(c_begin + a.split_span, nchunk);

  float acc[TILES][4], accs[TILES][4];  // accs: fp32's small terms (mma_chunk)
#pragma unroll
  for (int j = 0; j < TILES; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = accs[j][i] = 0.0f;

  // base is uniform across the warp (mma.sync needs every lane); lane t takes chunk base + t.
  int64_t base = c_begin + 4 * wk;
  // One step: U chunks of every tile's row and of x[g], x[g + 8], for lane t.
  struct Step {
    uint4 w[U][TILES], xa[U], xb[U];
  };
  auto load_step = [&](Step& s, int64_t b) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < TILES; ++j) s.w[u][j] = load_stream(wrow[j] + b + u * TPR + t);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      s.xa[u] = has_a ? load_keep(xa_p + b + u * TPR + t) : zero;
      s.xb[u] = has_b ? load_keep(xb_p + b + u * TPR + t) : zero;
    }
  };
  if constexpr (PIPE) {
    // A step's W and x are loaded into one of two register sets while the other set's step is
    // multiplied, so the loads of the next step are always in flight (the sets alternate: no
    // copies, so ptxas cannot sink the loads below the mma to reuse registers). Odd chunks
    // accumulate into a second set of tiles, halving the chain of dependent mma.
    float acc2[TILES][4], accs2[TILES][4];
#pragma unroll
    for (int j = 0; j < TILES; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc2[j][i] = accs2[j][i] = 0.0f;
    const int64_t span = c_end - base - (U - 1) * TPR - 4;  // whole steps: span / (U TPR) + 1
    int64_t steps = span >= 0 ? span / (U * TPR) + 1 : 0;
    if (steps > 0) {
      Step sa, sb;
      auto step = [&](const Step& cur, Step& next) {
        if (steps > 1) load_step(next, base + U * TPR);
#pragma unroll
        for (int u = 0; u < U; ++u)
          mma_chunk<T, TILES>(u % 2 ? acc2 : acc, u % 2 ? accs2 : accs, cur.w[u], cur.xa[u], cur.xb[u]);
        base += U * TPR;
        return --steps == 0;
      };
      load_step(sa, base);
#pragma unroll 1
      while (!step(sa, sb) && !step(sb, sa)) {
      }
    }
#pragma unroll
    for (int j = 0; j < TILES; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc[j][i] += acc2[j][i];
        accs[j][i] += accs2[j][i];
      }
  } else {
#pragma unroll 1
    for (; base + (U - 1) * TPR + 4 <= c_end; base += U * TPR) {
      Step s;
      load_step(s, base);
#pragma unroll
      for (int u = 0; u < U; ++u) mma_chunk<T, TILES>(acc, accs, s.w[u], s.xa[u], s.xb[u]);
    }
  }
  // Last partial steps: chunks past the split's end are zeros.
#pragma unroll 1
  for (; base < c_end; base += TPR) {
    const int64_t c = base + t;
    const bool in = c < c_end;
    uint4 w[TILES];
#pragma unroll
    for (int j = 0; j < TILES; ++j) w[j] = in ? load_stream(wrow[j] + c) : zero;
    const uint4 xa = in && has_a ? load_keep(xa_p + c) : zero;
    const uint4 xb = in && has_b ? load_keep(xb_p + c) : zero;
    mma_chunk<T, TILES>(acc, accs, w, xa, xb);
  }
  join_tf32<T, TILES * 4>(&acc[0][0], &accs[0][0]);

  pdl_trigger();
  // Lane (gq, t) holds D[gq][2t], D[gq][2t+1], D[gq+8][2t], D[gq+8][2t+1] of each tile: vector
  // gq (+8) and tile rows 2t, 2t+1. The warps that split K add their parts in a fixed order.
  if constexpr (WK > 1) {
    __shared__ float red[WK - 1][WR][TILES * 4][32];
    if (wk > 0) {
#pragma unroll
      for (int j = 0; j < TILES; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) red[wk - 1][wr][j * 4 + i][lane] = acc[j][i];
    }
    __syncthreads();
    if (wk > 0) return;
#pragma unroll
    for (int q = 0; q < WK - 1; ++q)
#pragma unroll
      for (int j = 0; j < TILES; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][i] += red[q][wr][j * 4 + i][lane];
  }

  if (split == a.splits - 1 && nchunk * VW < a.K) add_k_tail<T, 8 * TILES>(a, W, X, nv, row0, nchunk * VW, acc);
  // Warps of one 8-row tile store through shared memory too, but gain little there (a 16-byte
  // piece per vector either way) and config 40 ran up to 1.4 times slower with that code in the
  // kernel (H100, benchmarks/NOTES.md): only warps of two or more tiles take it.
  if constexpr (TILES >= 2 && sizeof(T) == 2) {
    if (rows_storable<T>(a)) {
      __shared__ __align__(16) T stage[WR][16 * (8 * TILES + 8)];
      store_tile_rows<T, 8 * TILES>(a, g, v0, nv, row0, acc, stage[wr]);
      return;
    }
  }
  store_tile<T, 8 * TILES>(a, split, g, v0, nv, row0, acc);
}

}  // namespace kernels
}  // namespace gemvx
