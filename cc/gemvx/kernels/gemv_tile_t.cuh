// Layout T, 16 vectors against one W on tensor cores, with W and x staged in shared memory.
//
// W is stored (K, M) row-major: y[v, m] = sum_k x[v, k] W[k, m] is X (16 x K) . W (K x BN columns)
// per block, as in gemv_tile.cuh: the block copies stages of 8 BKC rows of W (each BMC 16-byte
// chunks, i.e. BN = 8 BMC columns, in one run) and of x (16 vectors x BKC chunks of k) into shared
// memory with cp.async.cg, STAGES - 1 stages in flight.
// W chunk c of stage row r sits at slot c ^ (r % 8), so the eight rows of an ldmatrix matrix fall
// in eight bank groups. x is kept chunk-major ([chunk][vector]): the 8 vectors of a matrix are 8
// consecutive 16-byte lines.
// Fragments of mma.sync.m16n8k16 per 16 k (stage rows 16 kk .. 16 kk + 15):
//   A (16 vectors x 16 k): ldmatrix.x4 of (chunk 2kk, vectors 0-7), (2kk, 8-15), (2kk+1, 0-7),
//     (2kk+1, 8-15).
//   B (16 k x 8 columns) for two 8-column tiles: ldmatrix.x4.trans of (rows 0-7, chunk c),
//     (rows 8-15, c), (rows 0-7, c + 1), (rows 8-15, c + 1): transposed, lane (g, t) holds rows
//     2t, 2t+1 of column g, the B fragment.
// Each warp owns WN = BN / warps consecutive columns and every k of a stage. Rows past the split's
// end, vectors past nvec and columns past M are zero-filled by the copies (a chunk that crosses M
// or K copies only the bytes inside). Needs 16-byte aligned x rows as well as W rows; otherwise
// launch.cu runs the CUDA-core kernel with the same columns per block.
// fp32 (3xTF32, mma.m16n8k8.tf32, as gemv_tile.cuh): a chunk is 4 columns (BN = 4 BMC) and a stage
// still 8 BKC rows, x 2 BKC chunks of k. ldmatrix cannot transpose 32-bit elements, so lane (g, t)
// reads its B fragment (rows t and t + 4 of the k step, column g of the tile) with two 32-bit
// shared loads. W rows are then unswizzled and padded by two chunks: a row is 8 words mod 32
// banks, so the 32 lanes' words (8 t + g) fall in 32 banks. x keeps the 16-bit layout: chunks
// 2 kk and 2 kk + 1 hold k 8 kk .. 8 kk + 7, and the same ldmatrix.x4 gives a0-a3 of the tf32 A
// fragment (element t of vector g's chunk). The big.big sums of two k steps go to the accumulator
// on the CUDA cores, the small terms into their own (join_tf32).
#pragma once

#include "gemv_tile.cuh"

namespace gemvx {
namespace kernels {

// 16-byte slots of a W row in shared memory (fp32: padded by two, see the header) and of a stage:
// 8 BKC rows of W, and 16 vectors x 8 BKC elements of x.
template <typename T, int BMC>
constexpr int tile_t_w_row() {
  return sizeof(T) == 4 ? BMC + 2 : BMC;
}
template <typename T, int BMC, int BKC>
constexpr int tile_t_stage_slots() {
  return 8 * BKC * tile_t_w_row<T, BMC>() + 16 * (8 * BKC / (16 / int(sizeof(T))));
}
// Dynamic shared memory of one block.
template <typename T, int BMC, int BKC, int STAGES>
constexpr int tile_t_smem_bytes() {
  return STAGES * tile_t_stage_slots<T, BMC, BKC>() * 16;
}

template <typename T, int THREADS, int BMC, int BKC, int STAGES>
__global__ void __launch_bounds__(THREADS) gemv_tile_t(const Args a) {
  constexpr int NV = 16;
  constexpr int VW = 16 / sizeof(T);  // elements per 16-byte chunk
  constexpr bool kF32 = std::is_same<T, float>::value;
  constexpr int WARPS = THREADS / 32;
  constexpr int BN = VW * BMC;        // columns per block
  constexpr int WN = BN / WARPS;      // columns per warp
  constexpr int KR = 8 * BKC;         // rows of W (k) per stage
  constexpr int WROW = tile_t_w_row<T, BMC>();
  constexpr int RSTEP = THREADS / BMC;
  constexpr int W_SLOTS = KR * WROW;
  constexpr int W_COPIES = KR * BMC / THREADS;
  constexpr int X_CHUNKS = NV * (KR / VW);
  constexpr int X_COPIES = (X_CHUNKS + THREADS - 1) / THREADS;
  constexpr int STAGE = tile_t_stage_slots<T, BMC, BKC>();
  static_assert(STAGE == W_SLOTS + X_CHUNKS, "gemv_tile_t: the stage's slots");
  static_assert(THREADS % 32 == 0, "gemv_tile_t: whole warps");
  static_assert(WN % 16 == 0 && BMC % 8 == 0 && THREADS % BMC == 0 && BKC % 2 == 0,
                "gemv_tile_t: 16-column pairs of tiles per warp, whole 8-chunk swizzle groups");
  static_assert(W_COPIES * THREADS == KR * BMC, "gemv_tile_t: every thread copies as many W chunks");
  static_assert(STAGES >= 2, "gemv_tile_t: at least two stages");
  extern __shared__ uint4 smem[];
  pdl_wait();

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const BlockWork<T, NV> bw(a);
  const int split = bw.split, nv = bw.nv;
  const int64_t g = bw.g, v0 = bw.v0;
  const T* const W = bw.W;
  const T* const X = bw.X;
  const int64_t col0 = int64_t(blockIdx.x) * BN;

  const int64_t k_begin = min(int64_t(split) * a.split_span, a.K);
  const int64_t k_end = min(k_begin + a.split_span, a.K);
  const int64_t steps = (k_end - k_begin + KR - 1) / KR;

  // This thread's W copies: chunk cc (columns col0 + 8 cc ..) of stage rows r0 + n RSTEP, only the
  // bytes of the columns inside M.
  const int cc = threadIdx.x % BMC;
  const int r0 = threadIdx.x / BMC;
  const int64_t cols_left = a.M - (col0 + VW * cc);
  const int w_bytes = cols_left >= VW ? 16 : cols_left > 0 ? int(sizeof(T) * cols_left) : 0;
  const T* const w0 = W + col0 + VW * cc;  // + k ldw; used only when w_bytes > 0
  auto load_stage = [&](int buf, int64_t step) {
    const int64_t k0 = k_begin + step * KR;  // first row of the stage
    uint4* const dst = smem + buf * STAGE;
    // A copy that reads nothing (source size 0) still gets a valid address: W's or x's first chunk.
#pragma unroll
    for (int n = 0; n < W_COPIES; ++n) {
      const int r = r0 + n * RSTEP;
      const bool ok = k0 + r < k_end && w_bytes > 0;
      cp_async16_w(dst + r * WROW + (kF32 ? cc : cc ^ (r % 8)), ok ? w0 + (k0 + r) * a.ldw : W, ok ? w_bytes : 0);
    }
#pragma unroll
    for (int n = 0; n < X_COPIES; ++n) {
      const int j = threadIdx.x + n * THREADS;
      if (X_CHUNKS % THREADS != 0 && j >= X_CHUNKS) break;
      const int c = j / NV, v = j % NV;
      const int64_t kc = k0 + VW * c, left = k_end - kc;
      const bool ok = v < nv && left > 0;
      cp_async16(dst + W_SLOTS + j, ok ? X + int64_t(v) * a.x_vec + kc : X,
                 !ok ? 0 : left >= VW ? 16 : int(sizeof(T) * left));
    }
  };

  float acc[WN / 8][4], accs[WN / 8][4];  // accs: fp32's small terms
#pragma unroll
  for (int j = 0; j < WN / 8; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = accs[j][i] = 0.0f;

  // ldmatrix addresses inside a stage (see the header).
  const int xa_line = (lane / 16) * NV + lane % 8 + 8 * ((lane / 8) % 2);  // + 2 kk NV
  const int wb_row = lane % 8 + 8 * ((lane / 8) % 2);                       // + 16 kk
  const int wb_chunk = warp * (WN / 8) + lane / 16;                         // + 2 p
  // fp32: lane (g, t)'s B word of k step kk, 8-column tile j: row 8 kk + t (b0; b1 4 rows on),
  // column 8 j + g of the warp's.
  const int wb_word = (lane % 4) * 4 * WROW + warp * WN + lane / 4;  // + 32 kk WROW + 8 j
  auto compute = [&](int buf) {
    const uint4* const s = smem + buf * STAGE;
    if constexpr (kF32) {
      const float* const sw = reinterpret_cast<const float*>(s) + wb_word;
      tf32_step_pairs<BKC>(acc, [&](int kk, float (&part)[WN / 8][4]) {
        uint32_t af[4];
        ldsm_x4(af, s + W_SLOTS + 2 * kk * NV + xa_line);
        Tf32Pair ap[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) ap[e] = split_tf32(af[e]);
#pragma unroll
        for (int j = 0; j < WN / 8; ++j) {
          const float* const b = sw + 32 * kk * WROW + 8 * j;
          mma_tf32x3(part[j], accs[j], ap, split_tf32(__float_as_uint(b[0])),
                     split_tf32(__float_as_uint(b[16 * WROW])));
        }
      });
    } else {
#pragma unroll
      for (int kk = 0; kk < BKC / 2; ++kk) {
        uint32_t af[4];
        ldsm_x4(af, s + W_SLOTS + 2 * kk * NV + xa_line);
#pragma unroll
        for (int p = 0; p < WN / 16; ++p) {
          uint32_t bf[4];
          ldsm_x4_trans(bf, s + (16 * kk + wb_row) * BMC + ((wb_chunk + 2 * p) ^ (lane % 8)));
          mma_16816(acc[2 * p], af, bf[0], bf[1], T{});
          mma_16816(acc[2 * p + 1], af, bf[2], bf[3], T{});
        }
      }
    }
  };

  run_stages<STAGES>(steps, load_stage, compute);
  join_tf32<T, WN / 2>(&acc[0][0], &accs[0][0]);
  pdl_trigger();

  if constexpr (!kF32) {  // store_tile_rows stages 16-bit pairs
    if (rows_storable<T>(a)) {
      // Through the ring, once every warp is done with its last stage (no copies are in flight).
      static_assert(WARPS * 16 * (WN + 8) * int(sizeof(T)) <= STAGES * STAGE * 16, "staged outputs fit the ring");
      __syncthreads();
      store_tile_rows<T, WN>(a, g, v0, nv, col0 + warp * WN, acc, reinterpret_cast<T*>(smem) + warp * 16 * (WN + 8));
      return;
    }
  }
  store_tile<T, WN>(a, split, g, v0, nv, col0 + warp * WN, acc);
}

}  // namespace kernels
}  // namespace gemvx
