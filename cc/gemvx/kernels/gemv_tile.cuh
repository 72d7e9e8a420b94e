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
// zero-filled by the copies (source size 0). Split-K and the K % 8 tail work as in the other
// row-major kernels. fp32 and operands without 16-byte alignment run the CUDA-core kernel with the
// same rows per block instead (launch.cu).
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

// Dynamic shared memory of one block: STAGES x (BM rows of W + 16 vectors of x) x BKC chunks.
template <int BM, int BKC, int STAGES>
constexpr int tile_smem_bytes() {
  return STAGES * (BM + 16) * BKC * 16;
}

template <typename T, int THREADS, int BM, int BKC, int STAGES>
__global__ void __launch_bounds__(THREADS) gemv_tile(const Args a) {
  constexpr int NV = 16;
  constexpr int VW = 8;
  constexpr int WARPS = THREADS / 32;
  constexpr int R = BM / WARPS;                // rows per warp
  constexpr int RSTEP = THREADS / BKC;         // rows (or vectors) between a thread's copies
  constexpr int W_COPIES = BM * BKC / THREADS;  // 16-byte copies per thread and stage
  constexpr int X_COPIES = NV * BKC / THREADS;
  constexpr int STAGE = (BM + NV) * BKC;        // 16-byte slots per stage
  static_assert(sizeof(T) == 2 && THREADS % 32 == 0, "gemv_tile: 16-bit types, whole warps");
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

  float acc[R / 8][4];
#pragma unroll
  for (int j = 0; j < R / 8; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;

  // ldmatrix addresses inside a stage, for the k step's first chunk c = 2 kk (see the header).
  const int xa_row = lane % 8 + 8 * ((lane / 8) % 2), xa_chunk = lane / 16;
  const int wb_row = warp * R + lane % 8 + 8 * (lane / 16), wb_chunk = (lane / 8) % 2;
  auto compute = [&](int buf) {
    const uint4* const s = smem + buf * STAGE;
#pragma unroll
    for (int kk = 0; kk < BKC / 2; ++kk) {
      uint32_t af[4];
      ldsm_x4(af, s + (BM + xa_row) * BKC + ((2 * kk + xa_chunk) ^ (lane % 8)));
#pragma unroll
      for (int p = 0; p < R / 16; ++p) {
        uint32_t bf[4];
        ldsm_x4(bf, s + (wb_row + 16 * p) * BKC + ((2 * kk + wb_chunk) ^ (lane % 8)));
        mma_16816(acc[2 * p], af, bf[0], bf[1], T{});
        mma_16816(acc[2 * p + 1], af, bf[2], bf[3], T{});
      }
    }
  };

  run_stages<STAGES>(steps, load_stage, compute);
  pdl_trigger();

  const int64_t m0 = row0 + warp * R;
  if (split == a.splits - 1 && nchunk * VW < a.K) add_k_tail<T, R>(a, W, X, nv, m0, nchunk * VW, acc);
  if (rows_storable<T>(a)) {
    // Through the ring, once every warp is done with its last stage (no copies are in flight).
    static_assert(WARPS * 16 * (R + 8) * int(sizeof(T)) <= STAGES * STAGE * 16, "staged outputs fit the ring");
    __syncthreads();
    store_tile_rows<T, R>(a, g, v0, nv, m0, acc, reinterpret_cast<T*>(smem) + warp * 16 * (R + 8));
  } else {
    store_tile<T, R>(a, split, g, v0, nv, m0, acc);
  }
}

}  // namespace kernels
}  // namespace gemvx
