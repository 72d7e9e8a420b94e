// Layout N, 16 vectors against one W on tensor cores, with W and x staged in shared memory.
//
// y[v, m] = dot(W[m, :], x[v, :]) for up to 16 vectors is X (16 x K) . W^T (K x BM rows) per block,
// computed as a small GEMM: every thread of the block copies its share of a stage (BM rows x BKC
// 16-byte chunks of W, 16 vectors x BKC chunks of x) into shared memory with cp.async.cg (W and x
// pass L2 only), STAGES - 1 stages ahead of the math. A warp-wide copy instruction covers whole
// runs of one row (BKC x 16 bytes), the order in which HBM streams fastest (benchmarks/NOTES.md:
// the multi-vector kernels' 8-rows-by-64-byte register loads are what held them back).
// Shared memory holds each row's chunks swizzled (chunk c of row r at slot c ^ (r % 8)), so the
// eight 16-byte lines that one ldmatrix matrix reads (8 rows or vectors at one chunk) fall in eight
// different bank groups, and the copies of 8 consecutive chunks of a row stay conflict-free too.
// Fragments of mma.sync.m16n8k16 (fp32 accumulate), one per 16 k = two chunks c, c + 1:
//   A (16 vectors x 16 k): ldmatrix.x4 of (vectors 0-7, c), (vectors 8-15, c), (0-7, c + 1),
//     (8-15, c + 1): lane L gives the address of vector L % 8 + 8 ((L / 8) % 2), chunk c + L / 16.
//   B (16 k x 8 rows) for two 8-row tiles: ldmatrix.x4 of (rows 0-7, c), (rows 0-7, c + 1),
//     (rows 8-15, c), (rows 8-15, c + 1): lane L gives row L % 8 + 8 (L / 16), chunk c + (L / 8) % 2.
// A block's warps own R = BM / warps consecutive rows each and every k of a stage, so no reduction
// between warps is needed. Rows past M, vectors past nvec and chunks past the split's end are
// zero-filled by the copies (source size 0). Split-K and the K tail after the last 16-byte chunk
// work as in the other row-major kernels. Operands without 16-byte alignment run the CUDA-core
// kernel with the same rows per block instead (launch.cu).
// fp32 takes the same copies, swizzle and ldmatrix addresses: a chunk is 4 elements, and an 8x8
// matrix of 16-bit pairs read from fp32 rows gives lane (g, t) element t of row g's chunk, which is
// what mma.m16n8k8.tf32 wants, with chunk c in k slots 0-3 and chunk c + 1 in slots 4-7 (A: a0, a1
// from (vectors 0-7, 8-15, c), a2, a3 from c + 1; B: b0 from (rows, c), b1 from (rows, c + 1)). So a
// k step is 8 elements instead of 16, and the products are gemv_mma's 3xTF32 (mma_tf32x3): every
// fragment split into a tf32 big and small part, the big.big sums of two k steps added to the
// accumulator on the CUDA cores, the small terms kept apart and joined at the end (join_tf32).
#pragma once

#include "common.cuh"
#include "gemv_mma.cuh"

namespace gemvx {
namespace kernels {

__device__ __forceinline__ void cp_async16(void* smem, const void* src, int src_bytes) {
  const unsigned d = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(src_bytes)
               : "memory");
}
// As cp_async16, for W, which is read once: with the L2 evict-first policy (l2_evict_first; the
// tile kernels 0.7-2.4% faster on an H200, 0.6-1.7% on an H100, copies rotated past 32x L2;
// benchmarks/NOTES.md).
__device__ __forceinline__ void cp_async16_w(void* smem, const void* src, int src_bytes) {
  const unsigned d = unsigned(__cvta_generic_to_shared(smem));
  const uint64_t pol = l2_evict_first();
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(d), "l"(src), "r"(src_bytes),
               "l"(pol)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
// ldmatrix of four 8x8 matrices of 16-bit elements (per lane: the address of one row), plain and
// transposed, at a 32-bit shared-window address or at a generic pointer into shared memory.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* smem) {
  ldsm_x4(r, uint32_t(__cvta_generic_to_shared(smem)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* smem) {
  ldsm_x4_trans(r, uint32_t(__cvta_generic_to_shared(smem)));
}

// The block's stage loop: load_stage(buf, step) issues the copies of stage `step` into buffer buf,
// compute(buf) consumes a buffer; STAGES - 1 stages are in flight while one is consumed.
template <int STAGES, typename Load, typename Compute>
__device__ __forceinline__ void run_stages(int64_t steps, Load& load_stage, Compute& compute) {
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (st < steps) load_stage(st, st);
    cp_async_commit();
  }
#pragma unroll 1
  for (int64_t step = 0; step < steps; ++step) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage `step` is visible to all; every warp is done with step - 1's buffer
    const int64_t next = step + STAGES - 1;
    if (next < steps) load_stage(int(next % STAGES), next);
    cp_async_commit();
    compute(int(step % STAGES));
  }
}

// fp32 on the tile kernels: KSTEPS k steps of 8, in pairs; step(kk, part) adds k step kk's
// big.big products into part on the tensor cores, and each pair's part is added to acc on the
// CUDA cores (the small terms go to their own accumulator inside step).
template <int KSTEPS, int TILES, typename Step>
__device__ __forceinline__ void tf32_step_pairs(float (&acc)[TILES][4], Step&& step) {
#pragma unroll
  for (int k2 = 0; k2 < KSTEPS / 2; ++k2) {
    float part[TILES][4] = {};
#pragma unroll
    for (int h = 0; h < 2; ++h) step(2 * k2 + h, part);
#pragma unroll
    for (int j = 0; j < TILES; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[j][i] += part[j][i];
  }
}

// The math of one stage of the layout-N tile kernels (gemv_tile, gemv_tma_n): KSTEPS k steps of two
// 16-byte chunks each (16 k; fp32 8, as 3xTF32 through tf32_step_pairs), a_frag(kk, af) giving the
// A fragment of x and b_frag(kk, p, bf) the B fragments of the p-th pair of 8-row tiles.
template <typename T, int KSTEPS, int TILES, typename AFrag, typename BFrag>
__device__ __forceinline__ void tile_stage_mma(float (&acc)[TILES][4], float (&accs)[TILES][4], AFrag&& a_frag,
                                               BFrag&& b_frag) {
  if constexpr (std::is_same<T, float>::value) {
    tf32_step_pairs<KSTEPS>(acc, [&](int kk, float (&part)[TILES][4]) {
      uint32_t af[4];
      a_frag(kk, af);
      Tf32Pair ap[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) ap[e] = split_tf32(af[e]);
#pragma unroll
      for (int p = 0; p < TILES / 2; ++p) {
        uint32_t bf[4];
        b_frag(kk, p, bf);
        Tf32Pair bp[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) bp[e] = split_tf32(bf[e]);
        mma_tf32x3(part[2 * p], accs[2 * p], ap, bp[0], bp[1]);
        mma_tf32x3(part[2 * p + 1], accs[2 * p + 1], ap, bp[2], bp[3]);
      }
    });
  } else {
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
      uint32_t af[4];
      a_frag(kk, af);
#pragma unroll
      for (int p = 0; p < TILES / 2; ++p) {
        uint32_t bf[4];
        b_frag(kk, p, bf);
        mma_16816(acc[2 * p], af, bf[0], bf[1], T{});
        mma_16816(acc[2 * p + 1], af, bf[2], bf[3], T{});
      }
    }
  }
}

// Dynamic shared memory of one block: STAGES x (BM rows of W + 16 vectors of x) x BKC chunks.
template <int BM, int BKC, int STAGES>
constexpr int tile_smem_bytes() {
  return STAGES * (BM + 16) * BKC * 16;
}

template <typename T, int THREADS, int BM, int BKC, int STAGES>
__global__ void __launch_bounds__(THREADS) gemv_tile(const Args a) {
  constexpr int NV = 16;
  constexpr int VW = 16 / sizeof(T);  // elements per 16-byte chunk
  constexpr bool kF32 = std::is_same<T, float>::value;
  constexpr int WARPS = THREADS / 32;
  constexpr int R = BM / WARPS;                // rows per warp
  constexpr int RSTEP = THREADS / BKC;         // rows (or vectors) between a thread's copies
  constexpr int W_COPIES = BM * BKC / THREADS;  // 16-byte copies per thread and stage
  constexpr int X_COPIES = NV * BKC / THREADS;
  constexpr int STAGE = (BM + NV) * BKC;        // 16-byte slots per stage
  static_assert(THREADS % 32 == 0, "gemv_tile: whole warps");
  static_assert(R % 16 == 0 && BKC % 8 == 0 && THREADS % BKC == 0,
                "gemv_tile: 16-row pairs of tiles per warp, whole 8-chunk swizzle groups");
  static_assert(W_COPIES * THREADS == BM * BKC && X_COPIES * THREADS == NV * BKC && X_COPIES >= 1,
                "gemv_tile: every thread copies the same number of chunks");
  static_assert(STAGES >= 2, "gemv_tile: at least two stages");
  extern __shared__ uint4 smem[];
  pdl_wait();

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const BlockWork<T, NV> bw(a);
  const int split = bw.split, nv = bw.nv;
  const int64_t g = bw.g, v0 = bw.v0;
  const T* const W = bw.W;
  const T* const X = bw.X;
  const int64_t row0 = int64_t(blockIdx.x) * BM;

  const int64_t nchunk = a.K / VW;
  const int64_t c_begin = min(int64_t(split) * a.split_span, nchunk);
  const int64_t c_end = min(c_begin + a.split_span, nchunk);
  const int64_t steps = (c_end - c_begin + BKC - 1) / BKC;

  // This thread's copies: chunk cc of rows (vectors) r0 + n RSTEP.
  const int cc = threadIdx.x % BKC;
  const int r0 = threadIdx.x / BKC;
  const int64_t rows_here = min(a.M - row0, int64_t(BM));
  const T* const w0 = W + (row0 + r0) * a.ldw + VW * cc;  // used only for rows < rows_here
  const T* const x0 = X + int64_t(r0) * a.x_vec + VW * cc;  // used only for vectors < nv
  const int64_t w_step = int64_t(RSTEP) * a.ldw;
  auto load_stage = [&](int buf, int64_t step) {
    const int64_t c = c_begin + step * BKC;  // first chunk of the stage
    const bool in = c + cc < c_end;
    uint4* const dst = smem + buf * STAGE + r0 * BKC;
    auto swz = [&](int n) { return cc ^ ((r0 + n * RSTEP) % 8); };  // the row's slot of chunk cc
    // A copy that reads nothing (source size 0) still gets a valid address: W's or x's first chunk.
#pragma unroll
    for (int n = 0; n < W_COPIES; ++n) {
      const bool ok = in && r0 + n * RSTEP < rows_here;
      cp_async16_w(dst + n * RSTEP * BKC + swz(n), ok ? w0 + n * w_step + c * VW : W, ok ? 16 : 0);
    }
#pragma unroll
    for (int n = 0; n < X_COPIES; ++n) {
      const bool ok = in && r0 + n * RSTEP < nv;
      cp_async16(dst + (BM + n * RSTEP) * BKC + swz(n), ok ? x0 + n * RSTEP * a.x_vec + c * VW : X,
                 ok ? 16 : 0);
    }
  };

  float acc[R / 8][4], accs[R / 8][4];  // accs: fp32's small terms
#pragma unroll
  for (int j = 0; j < R / 8; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = accs[j][i] = 0.0f;

  // ldmatrix addresses inside a stage, for the k step's first chunk c = 2 kk (see the header).
  const int xa_row = lane % 8 + 8 * ((lane / 8) % 2), xa_chunk = lane / 16;
  const int wb_row = warp * R + lane % 8 + 8 * (lane / 16), wb_chunk = (lane / 8) % 2;
  // The fragments of k step kk (chunks 2 kk, 2 kk + 1): x's, and W's of the p-th pair of 8-row tiles.
  auto a_frag = [&](const uint4* s, int kk, uint32_t (&af)[4]) {
    ldsm_x4(af, s + (BM + xa_row) * BKC + ((2 * kk + xa_chunk) ^ (lane % 8)));
  };
  auto b_frag = [&](const uint4* s, int kk, int p, uint32_t (&bf)[4]) {
    ldsm_x4(bf, s + (wb_row + 16 * p) * BKC + ((2 * kk + wb_chunk) ^ (lane % 8)));
  };
  auto compute = [&](int buf) {
    const uint4* const s = smem + buf * STAGE;
    tile_stage_mma<T, BKC / 2>(acc, accs, [&](int kk, uint32_t (&af)[4]) { a_frag(s, kk, af); },
                               [&](int kk, int p, uint32_t (&bf)[4]) { b_frag(s, kk, p, bf); });
  };

  run_stages<STAGES>(steps, load_stage, compute);
  join_tf32<T, R / 2>(&acc[0][0], &accs[0][0]);
  pdl_trigger();

  const int64_t m0 = row0 + warp * R;
  if (split == a.splits - 1 && nchunk * VW < a.K) add_k_tail<T, R>(a, W, X, nv, m0, nchunk * VW, acc);
  if constexpr (!kF32) {  // store_tile_rows stages 16-bit pairs
    if (rows_storable<T>(a)) {
      // Through the ring, once every warp is done with its last stage (no copies are in flight).
      static_assert(WARPS * 16 * (R + 8) * int(sizeof(T)) <= STAGES * STAGE * 16, "staged outputs fit the ring");
      __syncthreads();
      store_tile_rows<T, R>(a, g, v0, nv, m0, acc, reinterpret_cast<T*>(smem) + warp * 16 * (R + 8));
      return;
    }
  }
  store_tile<T, R>(a, split, g, v0, nv, m0, acc);
}

}  // namespace kernels
}  // namespace gemvx
