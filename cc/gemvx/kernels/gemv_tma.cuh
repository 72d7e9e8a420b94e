// Up to 16 vectors against one W on tensor cores, Hopper (sm_90), layout T (gemv_tma_t) and
// layout N (gemv_tma_n, below): W and x streamed into shared memory by the tensor memory
// accelerator (TMA), one instruction per box of a stage, so the bytes in flight cost no registers
// and no per-thread copies (gemv_tile_t.cuh issues one cp.async per 16 bytes and thread). One bulk
// copy per row of a stage was tried first and ran at about half the bandwidth of gemv_tile_t
// (benchmarks/NOTES.md).
//
// Layout T: W is stored (K, M) row-major; a block owns BN = 8 BMC consecutive columns and its
// split of K, taken in stages of KR = 64 rows. A block is CW consumer warps and one producer warp,
// whose lane 0 arms a stage's `full` barrier with the stage's bytes and loads it: BN / 64 boxes
// of W (64 columns x KR rows) and one box of x (KR values of k x 16 vectors), each 128 bytes a
// row with the TMA's 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)), so the
// eight rows of an ldmatrix matrix fall in eight bank groups. It waits on the stage's `empty`
// barrier (one arrival per consumer warp) before refilling it.
// Each consumer warp owns WN = BN / CW columns and every k of a stage: per 16 k, one ldmatrix.x4
// of x (the A fragment: 16 vectors x 16 k) and, per 16 columns, one ldmatrix.x4.trans of W (two B
// fragments), then mma.m16n8k16 with fp32 accumulation, as gemv_tile_t.
// The tensor maps end at M, K and the vector count, and the TMA fills what lies past them with
// zeros: columns past M, vectors past the block's and the last split's rows past K all add
// nothing. Splits other than the last hold whole stages.
//
// fp32 (3xTF32 on mma.m16n8k8.tf32, as gemv_tile_t.cuh): a 128-byte row holds E = 32 values, so
// a box of W is 32 columns and a stage's x is two boxes of 32 k. ldmatrix cannot transpose 32-bit
// elements: lane (g, t) reads its B words with 32-bit shared loads, and the k step's slots t and
// t + 4 take stage rows 2t and 2t + 1 (the same order for A and B leaves the sum as it is). The
// rows a load reads are then 0, 2, 4, 6 (b0) or 1, 3, 5, 7 (b1) mod 8, whose swizzles send the
// two 16-byte chunks of an 8-column tile to eight different chunks: no bank conflict. A lane's
// a0, a2 (and a1, a3) are then x[g][2t], x[g][2t + 1] of the step, one 8-byte load. The big.big
// sums of two k steps go to the accumulator on the CUDA cores, the small terms into their own.
//
// Layout N (gemv_tma_n, the same body): W is (M, K) row-major; a block owns BM rows and its split
// of K, taken in stages of BKC 16-byte chunks of k: BKC / 8 boxes of W (BM rows x 128 bytes of k)
// and as many of x (16 vectors x 128 bytes), with the same swizzle. The fragments are
// gemv_tile.cuh's: per k step, ldmatrix.x4 of x (A) and, per 16 rows, ldmatrix.x4 of W (two B
// fragments), not transposed; fp32 reads the same matrices as 16-bit pairs into the tf32 mma.
// The tensor maps end at K and M, so the last split's k past K and rows past M add nothing.
//
// Requirements, checked by the launcher (which otherwise runs the CUDA-core kernel with the same
// outputs per block): compute capability 9.0, W and x 16-byte aligned, W's row and matrix strides
// and x's vector and matrix strides multiples of 16 bytes, and the ring within a block's shared
// memory.
#pragma once

#include "gemv_tile_t.cuh"
#include "tma.cuh"

namespace gemvx {
namespace kernels {

// The kernel's one argument: the tensor maps of W (layout T: dims M, K, groups, box E x 64 x 1,
// E = 128 / the element's bytes; layout N: dims K, M, groups, box E x BM x 1) and x (dims K,
// vectors, groups; box E x 16 x 1), and the call. The maps must live in kernel parameter space
// (64-byte aligned).
struct TmaTArgs {
  CUtensorMap wmap, xmap;
  Args a;
};

constexpr int kTmaTRows = 64;  // rows of W (k) per stage

// Values of type T in one 128-byte (swizzled) row of a box: the columns of a W box, the k of an x
// box.
template <typename T>
constexpr int tma_t_box_values() {
  return 128 / int(sizeof(T));
}
// Dynamic shared memory of one block: S stages of W (BMC 16-byte chunks x 64 rows) and x (16
// vectors x 64 values), and 1 KiB to align the ring to the 1024 bytes of the swizzle pattern.
template <typename T, int BMC, int S>
constexpr int tma_t_smem_bytes() {
  return S * (BMC * 16 * kTmaTRows + 16 * kTmaTRows * int(sizeof(T))) + 1024;
}
// Layout N (gemv_tma_n): S stages of W (BM rows x BKC 16-byte chunks of k) and x (16 vectors x BKC
// chunks), and the 1 KiB of alignment.
template <int BM, int BKC, int S>
constexpr int tma_n_smem_bytes() {
  return S * (BM + 16) * BKC * 16 + 1024;
}

// The body of both layouts' TMA kernels. TRANS (gemv_tma_t): P1 = BMC 16-byte column chunks per
// block, 64 rows of W a stage. Layout N (gemv_tma_n): P1 = BM rows per block, P2 = BKC 16-byte
// chunks of k a stage, in BKC / 8 boxes of BM rows x 128 bytes (W) and of 16 vectors (x).
// LOOP: the block takes output tiles blockIdx.x, + gridDim.x, ... (the launcher sizes the grid to
// the blocks that fit at once); its producer streams the next tile's stages while the consumer
// warps finish and store the last. Otherwise the block's tile is blockIdx.x.
template <typename T, bool TRANS, int THREADS, int P1, int P2, int S, bool LOOP>
__device__ __forceinline__ void tma_gemv(const TmaTArgs& p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int NV = 16;
  constexpr bool kF32 = std::is_same<T, float>::value;
  constexpr int VW = 16 / int(sizeof(T));   // values of a 16-byte chunk
  constexpr int E = tma_t_box_values<T>();  // values of a box row: columns of a W box (T), k
  constexpr int CW = THREADS / 32 - 1;      // consumer warps; the last warp produces
  constexpr int BN = TRANS ? VW * P1 : P1;  // outputs (columns, or rows of W) per block
  constexpr int WN = BN / CW;               // outputs per consumer warp
  constexpr int KR = TRANS ? kTmaTRows : P2 * VW;  // k per stage
  constexpr int BOX = TRANS ? kTmaTRows * 128 : BN * 128;  // bytes of one box of W
  constexpr int W_BYTES = (TRANS ? BN : KR) / E * BOX;
  constexpr int X_BOX = NV * 128;           // bytes of one box of x
  constexpr int STAGE = W_BYTES + KR / E * X_BOX;
  static_assert(S * STAGE + 1024 == (TRANS ? tma_t_smem_bytes<T, P1, S>() : tma_n_smem_bytes<P1, P2, S>()),
                "tma_gemv: the ring's size");
  static_assert(CW >= 1 && BN % CW == 0 && S >= 2 && (TRANS ? BN % E == 0 : P2 % 8 == 0 && BN <= 256),
                "tma_gemv: whole boxes of at most 256 rows");
  static_assert(WN % (TRANS && kF32 ? 8 : 16) == 0, "tma_gemv: whole tiles (ldmatrix: pairs of tiles) per warp");
  extern __shared__ __align__(128) uint8_t tma_t_ring[];
  __shared__ __align__(8) uint64_t full[S], empty[S];
  const Args& a = p.a;

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const BlockWork<T, NV> bw(a);
  const int split = bw.split, nv = bw.nv;
  const int64_t g = bw.g, v0 = bw.v0;
  const int64_t tiles = (a.M + BN - 1) / BN;  // output tiles (LOOP)
  // The split's k: a span of whole stages (rows of W; layout N: 16-byte chunks, whose count leaves
  // out K's last K % VW values, so the last split runs to K). The TMA's zero fill past K ends it.
  const int64_t span = TRANS ? a.split_span : a.split_span * VW;
  const int64_t k_begin = min(int64_t(split) * span, a.K);
  const int64_t k_end = !TRANS && split == a.splits - 1 ? a.K : min(k_begin + span, a.K);
  const int64_t steps = (k_end - k_begin + KR - 1) / KR;
  const uint32_t ring = (tma::addr(tma_t_ring) + 1023u) & ~1023u;
  const uint32_t full0 = tma::addr(&full[0]), empty0 = tma::addr(&empty[0]);

  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      tma::init(full0 + 8 * s, 1);
      tma::init(empty0 + 8 * s, CW);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  pdl_wait();

  if (warp == CW) {
    if (lane == 0) {
      const uint64_t policy = l2_evict_first();  // for W; x stays as it is
      // The stages of the tile at m0; st0: the block's stages before them (the ring's count).
      auto produce = [&](int64_t m0, int64_t st0) {
        for (int64_t j = 0; j < steps; ++j) {
          const int64_t st = st0 + j;
          const int s = int(st % S);
          const int64_t use = st / S;
          if (use > 0) tma::wait(empty0 + 8 * s, uint32_t(use - 1) & 1u);
          const int k0 = int(k_begin + j * KR);
          const uint32_t dst = ring + uint32_t(s) * STAGE, bar = full0 + 8 * s;
          tma::expect(bar, STAGE);
#pragma unroll
          for (int b = 0; b < W_BYTES / BOX; ++b) {
            if constexpr (TRANS)
              tma::box_hint(dst + b * BOX, &p.wmap, int(m0) + E * b, k0, int(g), bar, policy);
            else
              tma::box_hint(dst + b * BOX, &p.wmap, k0 + E * b, int(m0), int(g), bar, policy);
          }
#pragma unroll
          for (int b = 0; b < KR / E; ++b) tma::box(dst + W_BYTES + b * X_BOX, &p.xmap, k0 + E * b, int(v0), int(g), bar);
        }
      };
      if constexpr (LOOP) {
        int64_t st0 = 0;
        for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x, st0 += steps) produce(tile * BN, st0);
      } else {
        produce(int64_t(blockIdx.x) * BN, 0);
      }
    }
    pdl_trigger();
    return;
  }

  // The consumer warps' work on the tile at m0, whose stages follow st0 of the block's; last:
  // the block's last tile.
  auto consume = [&](int64_t m0, int64_t st0, bool last) {
    float acc[WN / 8][4], accs[WN / 8][4];  // accs: fp32's small terms
#pragma unroll
    for (int j = 0; j < WN / 8; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[j][i] = accs[j][i] = 0.0f;

#pragma unroll 1
    for (int64_t st = st0; st < st0 + steps; ++st) {
      const int s = int(st % S);
      tma::wait(full0 + 8 * s, uint32_t(st / S) & 1u);
      const uint32_t base = ring + uint32_t(s) * STAGE;
      if constexpr (!TRANS) {
        // ldmatrix rows of this lane (see gemv_tile.cuh): x's vector l % 8 + 8 ((l / 8) % 2) at
        // chunk + l / 16; W's row (of the warp's) l % 8 + 8 (l / 16) at chunk + (l / 8) % 2. A k
        // step (16 k; fp32: 8) is chunks 2 kk, 2 kk + 1: box kk / 4, chunks 2 (kk % 4) of it, each
        // at chunk ^ (row % 8) = ^ (l % 8).
        const uint32_t xa = base + W_BYTES + 128 * (lane % 8 + 8 * ((lane / 8) % 2));
        const uint32_t wb = base + 128 * (warp * WN + lane % 8 + 8 * (lane / 16));
        const int xc = lane / 16, wc = (lane / 8) % 2, sw = lane % 8;
        auto a_frag = [&](int kk, uint32_t (&af)[4]) {
          ldsm_x4(af, xa + (kk / 4) * X_BOX + 16 * ((2 * (kk % 4) + xc) ^ sw));
        };
        auto b_frag = [&](int kk, int q, uint32_t (&bf)[4]) {
          ldsm_x4(bf, wb + (kk / 4) * BOX + 16 * 128 * q + 16 * ((2 * (kk % 4) + wc) ^ sw));
        };
        tile_stage_mma<T, P2 / 2>(acc, accs, a_frag, b_frag);
      } else if constexpr (kF32) {
        // Lane (gq, t). B word of k step kk, tile j: stage row 8 kk + 2t (+ 1 for b1), column
        // warp WN + 8 j + gq, in box col / 32 at chunk (col % 32) / 4 ^ (row % 8), word col % 4.
        // A: vectors gq and gq + 8 at k 8 kk + 2t and + 1: box kk / 4, chunk 2 (kk % 4) + t / 2 ^ gq.
        const int gq = lane / 4, t = lane % 4;
        auto b_word = [&](int j, int odd) {  // byte offset in the stage, less k step kk's 1024
          const int col = warp * WN + 8 * j + gq;
          return (col / 32) * BOX + (2 * t + odd) * 128 + 16 * (((col % 32) / 4) ^ (2 * t + odd)) + 4 * (col % 4);
        };
        const uint8_t* const sb = tma_t_ring + (base - tma::addr(tma_t_ring));
        tf32_step_pairs<KR / 8>(acc, [&](int kk, float (&part)[WN / 8][4]) {
          const int xo = W_BYTES + (kk / 4) * X_BOX + 16 * ((2 * (kk % 4) + t / 2) ^ gq) + 8 * (t % 2);
          const float2 xl = *reinterpret_cast<const float2*>(sb + xo + 128 * gq);
          const float2 xh = *reinterpret_cast<const float2*>(sb + xo + 128 * (gq + 8));
          const Tf32Pair ap[4] = {split_tf32(__float_as_uint(xl.x)), split_tf32(__float_as_uint(xh.x)),
                                  split_tf32(__float_as_uint(xl.y)), split_tf32(__float_as_uint(xh.y))};
#pragma unroll
          for (int j = 0; j < WN / 8; ++j) {
            const uint8_t* const b = sb + 1024 * kk;
            mma_tf32x3(part[j], accs[j], ap, split_tf32(*reinterpret_cast<const uint32_t*>(b + b_word(j, 0))),
                       split_tf32(*reinterpret_cast<const uint32_t*>(b + b_word(j, 1))));
          }
        });
      } else {
        // ldmatrix rows of this lane: vector (A) or row of the 16-k step (B) l % 8 + 8 ((l / 8) % 2),
        // chunk + l / 16; the swizzle XORs the chunk with the row % 8 = l % 8.
        const int r16 = lane % 8 + 8 * ((lane / 8) % 2), sw = lane % 8, hi = lane / 16;
        const uint32_t xa = W_BYTES + 128 * r16;
        const uint32_t wb = 128 * r16;
        const int c0 = warp * (WN / 8) + hi;  // the warp's first 16-byte column chunk (of the block) + l / 16
#pragma unroll
        for (int kk = 0; kk < KR / 16; ++kk) {
          uint32_t af[4];
          ldsm_x4(af, base + xa + 16 * ((2 * kk + hi) ^ sw));
#pragma unroll
          for (int q = 0; q < WN / 16; ++q) {
            const int c = c0 + 2 * q;
            uint32_t bf[4];
            ldsm_x4_trans(bf, base + (c / 8) * BOX + 16 * kk * 128 + wb + 16 * ((c % 8) ^ sw));
            mma_16816(acc[2 * q], af, bf[0], bf[1], T{});
            mma_16816(acc[2 * q + 1], af, bf[2], bf[3], T{});
          }
        }
      }
      tma::release(empty0 + 8 * s);
    }
    join_tf32<T, WN / 2>(&acc[0][0], &accs[0][0]);
    if (last) pdl_trigger();

    // The outputs leave through shared memory where they can (16-bit: 16-byte rows of y): the ring is
    // free once every consumer warp is past the block's last stage (the producer loaded no more than
    // that; before it, the producer refills the ring with the next tile's stages).
    if constexpr (!kF32) {  // store_tile_rows stages 16-bit pairs
      constexpr int STAGED = 16 * (WN + 8) * int(sizeof(T));  // bytes per warp
      static_assert(CW * STAGED <= S * STAGE, "the staged outputs fit in the ring");
      if (last && rows_storable<T>(a)) {
        asm volatile("bar.sync 1, %0;" ::"r"(CW * 32) : "memory");
        T* stage = reinterpret_cast<T*>(tma_t_ring + (ring - tma::addr(tma_t_ring)) + warp * STAGED);
        store_tile_rows<T, WN>(a, g, v0, nv, m0 + warp * WN, acc, stage);
        return;
      }
    }
    store_tile<T, WN>(a, split, g, v0, nv, m0 + warp * WN, acc);
  };
  if constexpr (LOOP) {
    int64_t st0 = 0;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x, st0 += steps)
      consume(tile * BN, st0, tile + gridDim.x >= tiles);
  } else {
    consume(int64_t(blockIdx.x) * BN, 0, true);
  }
#endif
}

// Layout T (see the header): BMC 16-byte column chunks per block, S stages of 64 rows of W.
template <typename T, int THREADS, int BMC, int S, bool LOOP = false>
__global__ void __launch_bounds__(THREADS, 1) gemv_tma_t(const __grid_constant__ TmaTArgs p) {
  tma_gemv<T, true, THREADS, BMC, 8, S, LOOP>(p);
}
// Layout N (see the header): BM rows per block, S stages of BKC 16-byte chunks of k.
template <typename T, int THREADS, int BM, int BKC, int S, bool LOOP = false>
__global__ void __launch_bounds__(THREADS, 1) gemv_tma_n(const __grid_constant__ TmaTArgs p) {
  tma_gemv<T, false, THREADS, BM, BKC, S, LOOP>(p);
}

}  // namespace kernels
}  // namespace gemvx
