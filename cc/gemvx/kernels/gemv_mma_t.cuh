// Layout T, several vectors against one W, on tensor cores (fp16 / bf16; fp32 as 3xTF32; 16-byte
// body).
//
// y[v, m] = sum_k x[v, k] W[k, m] for up to 16 vectors is the product X (16 x K) . W (K x M); each
// warp feeds it to mma.sync.m16n8k16 (fp32 accumulate) with A = 16 vectors of x, B = 16 k x 8
// columns of W, D = 16 vectors x 8 columns.
// W is (K, M) row-major, so a lane's 16-byte load holds 8 columns of one k, while the B fragment
// wants 2 k of one column per register: movmatrix transposes the loads in registers.
//   lane (g = lane / 4, t = lane % 4) loads columns 8t..8t+7 of a warp tile of 32 columns, from
//   row R(g) = 4 (g / 2) + g % 2 (first load) and R(g) + 2 (second load) of a 16-row group.
//   Word j of the loads of all lanes is an 8x8 tile in the m8n8 fragment layout (lane (g, t):
//   tile row g, tile columns 2t, 2t+1 = W columns 8t + 2j, 8t + 2j + 1); transposed, lane (g, t)
//   holds tile column g at tile rows 2t, 2t+1 = W rows R(2t) = 4t, 4t+1 (first load; 4t+2, 4t+3
//   from the second): exactly the B fragment (k slots 2t, 2t+1 and 2t+8, 2t+9; column g) of an mma
//   whose column g is W column 8 (g / 2) + 2j + g % 2. One mma per word j, all four sharing A.
// With that row order, lane (g, t)'s A fragment is x[g][4t .. 4t+3] and x[g + 8][4t .. 4t+3] of the
// group: one 8-byte load per vector where x allows it (else element loads), and D of mma j, lane
// (g, t), is vectors g, g + 8 at W columns 8t + 2j, 8t + 2j + 1: each lane ends with 8 consecutive
// columns of two vectors.
// Block: CB 16-byte column chunks as in the CUDA-core kernel (same grid); a warp takes TILES (P2)
// tiles of 32 columns, so WM = CB / (4 TILES) warps lie along M and WK = warps / WM split the
// block's K range (warp wk takes groups wk, wk + WK, ...; U groups in flight), meeting in shared
// memory in a fixed order. Split-K across blocks as in the other kernels. Rows past the split's end
// and vectors past nvec are zeros; columns past M are zeros and never stored; a chunk that crosses
// M is read element by element. PIPE software-pipelines the steps: the next step's W loads are
// issued before this step's math (x, small and cached, is loaded when its step is consumed).
// Operands without 16-byte alignment run the CUDA-core kernel instead (launch_impl.cuh).
// fp32 runs on the tf32 mma.m16n8k8 with fp32 accuracy, split as in gemv_mma ("3xTF32"), and needs
// no transpose: a group is 8 rows of W, and lane (g, t) loads 16-byte chunk g (columns 4g..4g+3)
// of the warp tile from rows 2t and 2t + 1, i.e. k slots t and t + 4 of the B fragment, so element
// j of its two loads is the B fragment of mma j, whose column n is W column 4n + j. Its A fragment
// is x[g][2t, 2t + 1] and x[g + 8][2t, 2t + 1] (one 8-byte load per vector), and D of mma j, lane
// (g, t), is vectors g, g + 8 at W columns 8t + j and 8t + 4 + j: again 8 consecutive columns
// of two vectors. A warp's load covers 4 rows x 128 contiguous bytes; a warp tile is 32 columns as
// for 16-bit types (8 chunks), so a block has CB / (8 TILES) warps along M and the same rows per
// step (8 x twice the warps along K).
#pragma once

#include "common.cuh"
#include "gemv_mma.cuh"

namespace gemvx {
namespace kernels {

__device__ __forceinline__ uint32_t transpose_8x8(uint32_t v) {
  uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(v));
  return r;
}

// Elements p[0..n) (n < 16 / sizeof(T)) packed into the low end of a 16-byte chunk, zeros after.
template <typename T>
__device__ __forceinline__ uint4 load_partial(const T* p, int n) {
  uint32_t w[4] = {0, 0, 0, 0};
  if constexpr (sizeof(T) == 4) {
    const uint32_t* q = reinterpret_cast<const uint32_t*>(p);
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (i < n) w[i] = __ldg(q + i);
  } else {
    const uint16_t* q = reinterpret_cast<const uint16_t*>(p);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (i < n) w[i / 2] |= uint32_t(__ldg(q + i)) << (16 * (i % 2));
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// One 16-byte chunk of a row of W at column m: streamed when it lies inside the M columns,
// element by element where it crosses M, zeros past M.
template <typename T>
__device__ __forceinline__ uint4 load_w(const T* p, int cols_left) {
  if (cols_left >= int(16 / sizeof(T))) return load_stream(reinterpret_cast<const uint4*>(p));
  return load_partial(p, cols_left);
}

// 8 bytes of x[v] from k (4 elements of 16-bit types, 2 of fp32) as two words (zeros past n
// elements): one 8-byte load when x allows it.
template <typename T>
__device__ __forceinline__ uint2 load_x8(const T* p, bool wide, int n) {
  constexpr int XN = 8 / sizeof(T);
  if (wide && n >= XN) return __ldg(reinterpret_cast<const uint2*>(p));
  const uint4 r = load_partial(p, n < XN ? n : XN);
  return make_uint2(r.x, r.y);
}

// One group (16 rows; fp32: 8): TILES x 2 loads of W (first / second row set), x of vectors g and
// g + 8. fp32: the big.big products into acc (through a zeroed accumulator per mma, added on the
// CUDA cores: see gemv_mma's mma_chunk), the small terms into accs (unused for 16-bit types).
template <typename T, int TILES>
__device__ __forceinline__ void mma_group(float (&acc)[TILES][4][4], float (&accs)[TILES][4][4],
                                          const uint4 (&w)[TILES][2], const uint2& xa, const uint2& xb) {
  if constexpr (std::is_same<T, float>::value) {
    // A: x[g] and x[g + 8] at k slot t (row 2t: word x) and t + 4 (row 2t + 1: word y).
    const Tf32Pair af[4] = {split_tf32(xa.x), split_tf32(xb.x), split_tf32(xa.y), split_tf32(xb.y)};
#pragma unroll
    for (int c = 0; c < TILES; ++c) {
      const uint32_t lo[4] = {w[c][0].x, w[c][0].y, w[c][0].z, w[c][0].w};
      const uint32_t hi[4] = {w[c][1].x, w[c][1].y, w[c][1].z, w[c][1].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma_tf32x3(part, accs[c][j], af, split_tf32(lo[j]), split_tf32(hi[j]));
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[c][j][i] += part[i];
      }
    }
  } else {
    const uint32_t a[4] = {xa.x, xb.x, xa.y, xb.y};
#pragma unroll
    for (int c = 0; c < TILES; ++c) {
      const uint32_t lo[4] = {w[c][0].x, w[c][0].y, w[c][0].z, w[c][0].w};
      const uint32_t hi[4] = {w[c][1].x, w[c][1].y, w[c][1].z, w[c][1].w};
#pragma unroll
      for (int j = 0; j < 4; ++j)
        mma_16816(acc[c][j], a, transpose_8x8(lo[j]), transpose_8x8(hi[j]), T{});
    }
  }
}

template <typename T, int THREADS, int CB, int TILES, int U, bool PIPE>
__global__ void __launch_bounds__(THREADS) gemv_mma_t(const Args a) {
  constexpr bool F32 = std::is_same<T, float>::value;
  constexpr int NV = 16;
  constexpr int VW = 16 / sizeof(T);        // columns per 16-byte chunk
  constexpr int KG = F32 ? 8 : 16;          // rows of W per group (one mma's k)
  constexpr int XN = 8 / sizeof(T);         // x elements per lane, vector and group
  constexpr int WARPS = THREADS / 32;
  constexpr int WM = CB * VW / (32 * TILES);  // warps along M
  constexpr int WK = WARPS / WM;              // warps splitting the block's K range
  constexpr int STEP = KG * WK;               // rows between a warp's consecutive groups
  static_assert(THREADS % 32 == 0, "gemv_mma_t: whole warps");
  static_assert(CB * VW % (32 * TILES) == 0 && WM >= 1 && WARPS % WM == 0,
                "gemv_mma_t: CB = 32 / (16-byte chunk's columns) x TILES x (warps along M)");
  pdl_wait();

  const int lane = threadIdx.x % 32;
  const int wm = (threadIdx.x / 32) % WM;
  const int wk = (threadIdx.x / 32) / WM;
  const int gq = lane / 4;  // vector gq (and gq + 8) of x; 16-bit: load row R(gq); fp32: chunk gq
  const int t = lane % 4;   // x rows XN t.. of the group; 16-bit: chunk t; fp32: rows 2t, 2t + 1
  const BlockWork<T, NV> bw(a);
  const int split = bw.split, nv = bw.nv;
  const int64_t g = bw.g, v0 = bw.v0;
  const T* const X = bw.X;
  // The first load's row in the group and the second's distance from it.
  const int row = F32 ? 2 * t : 4 * (gq / 2) + gq % 2;
  constexpr int ROW2 = F32 ? 1 : 2;

  const int64_t tile0 = int64_t(blockIdx.x) * CB * VW + wm * TILES * 32;  // the warp's first column
  const int64_t col0 = tile0 + (F32 ? 4 * gq : 8 * t);                     // the lane's chunk
  int left[TILES];  // columns of the lane's chunk inside M (VW: all of it; <= 0: none)
#pragma unroll
  for (int c = 0; c < TILES; ++c) left[c] = int(max(min(a.M - (col0 + 32 * c), int64_t(VW)), int64_t(0)));
  const bool has_a = gq < nv, has_b = gq + 8 < nv;
  const T* xa_p = X + int64_t(has_a ? gq : 0) * a.x_vec + XN * t;
  const T* xb_p = X + int64_t(has_b ? gq + 8 : 0) * a.x_vec + XN * t;

  const int64_t k_begin = min(int64_t(split) * a.split_span, a.K);
  const int64_t k_end = min(k_begin + a.split_span, a.K);
  // 8-byte x loads: every vector row, and every group start, 8-byte aligned (uniform per block).
  const bool wide = (reinterpret_cast<uintptr_t>(X) & 7) == 0 && (nv == 1 || a.x_vec % XN == 0) &&
                    k_begin % XN == 0;
  const uint2 zero2 = make_uint2(0, 0);
  const uint4 zero4 = make_uint4(0, 0, 0, 0);

  float acc[TILES][4][4], accs[TILES][4][4];  // accs: fp32's small terms (mma_group)
#pragma unroll
  for (int c = 0; c < TILES; ++c)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[c][j][i] = accs[c][j][i] = 0.0f;

  // kb is uniform across the warp (movmatrix and mma.sync need every lane); wp is the lane's
  // first row of group kb. Whole steps of U groups: blocks whose columns all lie inside M, with
  // 8-byte x loads, take the plain loads (FAST); the others check each lane's chunk and x.
  int64_t kb = k_begin + KG * wk;
  const T* wp = bw.W + (kb + row) * a.ldw + col0;
  const int64_t ld2 = ROW2 * a.ldw, ld_step = STEP * a.ldw;
  auto steps = [&](auto fast) {
    constexpr bool FAST = decltype(fast)::value;
    auto load_step = [&](uint4 (&w)[U][TILES][2], const T* p0) {
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int c = 0; c < TILES; ++c)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const T* p = p0 + u * ld_step + h * ld2 + 32 * c;
            if constexpr (FAST)
              w[u][c][h] = load_stream(reinterpret_cast<const uint4*>(p));
            else
              w[u][c][h] = left[c] > 0 ? load_w(p, left[c]) : zero4;
          }
    };
    auto load_xs = [&](uint2 (&xa)[U], uint2 (&xb)[U], int64_t k0) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        xa[u] = has_a ? load_x8(xa_p + k0 + u * STEP, FAST || wide, XN) : zero2;
        xb[u] = has_b ? load_x8(xb_p + k0 + u * STEP, FAST || wide, XN) : zero2;
      }
    };
    if constexpr (PIPE) {
      // A step's W is loaded into one of two register sets while the other set's step is
      // multiplied (the sets alternate: no copies; see gemv_mma); x is loaded when its step is
      // consumed. `steps` counts the whole steps left.
      struct Step {
        uint4 w[U][TILES][2];
      };
      const int64_t span = k_end - kb - (U - 1) * STEP - KG;  // whole steps: span / (U STEP) + 1
      int64_t steps = span >= 0 ? span / (U * STEP) + 1 : 0;
      if (steps > 0) {
        Step sa, sb;
        auto step = [&](const Step& cur, Step& next) {
          if (steps > 1) load_step(next.w, wp + U * ld_step);
          uint2 xa[U], xb[U];
          load_xs(xa, xb, kb);
#pragma unroll
          for (int u = 0; u < U; ++u) mma_group<T, TILES>(acc, accs, cur.w[u], xa[u], xb[u]);
          kb += U * STEP;
          wp += U * ld_step;
          return --steps == 0;
        };
        load_step(sa.w, wp);
#pragma unroll 1
        while (!step(sa, sb) && !step(sb, sa)) {
        }
      }
    } else {
#pragma unroll 1
      for (; kb + (U - 1) * STEP + KG <= k_end; kb += U * STEP, wp += U * ld_step) {
        uint4 w[U][TILES][2];
        uint2 xa[U], xb[U];
        load_step(w, wp);
        load_xs(xa, xb, kb);
#pragma unroll
        for (int u = 0; u < U; ++u) mma_group<T, TILES>(acc, accs, w[u], xa[u], xb[u]);
      }
    }
  };
  if (wide && (int64_t(blockIdx.x) + 1) * CB * VW <= a.M)
    steps(std::true_type{});
  else
    steps(std::false_type{});
  // Last groups, partly past the split's end: those rows are zeros.
#pragma unroll 1
  for (; kb < k_end; kb += STEP, wp += ld_step) {
    uint4 w[TILES][2];
#pragma unroll
    for (int c = 0; c < TILES; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t k = kb + row + ROW2 * h;
        w[c][h] = left[c] > 0 && k < k_end ? load_w(wp + h * ld2 + 32 * c, left[c]) : zero4;
      }
    const int n = int(min(k_end - (kb + XN * t), int64_t(XN)));  // x elements of the lane's XN in the split
    const uint2 xa = has_a && n > 0 ? load_x8(xa_p + kb, wide, n) : zero2;
    const uint2 xb = has_b && n > 0 ? load_x8(xb_p + kb, wide, n) : zero2;
    mma_group<T, TILES>(acc, accs, w, xa, xb);
  }
  join_tf32<T, TILES * 16>(&acc[0][0][0], &accs[0][0][0]);

  pdl_trigger();
  // The warps that split K add their parts in a fixed order.
  if constexpr (WK > 1) {
    __shared__ float red[WK - 1][WM][TILES * 16][32];
    if (wk > 0) {
#pragma unroll
      for (int c = 0; c < TILES; ++c)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) red[wk - 1][wm][(c * 4 + j) * 4 + i][lane] = acc[c][j][i];
    }
    __syncthreads();
    if (wk > 0) return;
#pragma unroll
    for (int q = 0; q < WK - 1; ++q)
#pragma unroll
      for (int c = 0; c < TILES; ++c)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[c][j][i] += red[q][wm][(c * 4 + j) * 4 + i][lane];
  }

  // Lane (gq, t), mma j of tile c: vector gq (i < 2) or gq + 8, columns 8t + 2j + i % 2 of the tile
  // (fp32: 8t + 4 (i % 2) + j).
#pragma unroll
  for (int c = 0; c < TILES; ++c)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int v = gq + (i >= 2 ? 8 : 0);
        const int64_t m = tile0 + 32 * c + 8 * t + (F32 ? 4 * (i & 1) + j : 2 * j + (i & 1));
        if (v < nv && m < a.M) store_output<T>(a, split, g, v0 + v, m, acc[c][j][i]);
      }
}

}  // namespace kernels
}  // namespace gemvx
