// Layout T, 16 vectors against one W on tensor cores, Hopper (sm_90): W and x streamed into
// shared memory by the tensor memory accelerator (TMA), one instruction per 64-column box of a
// stage, so the bytes in flight cost no registers and no per-thread copies (gemv_tile_t.cuh issues
// one cp.async per 16 bytes and thread). One bulk copy per row of a stage was tried first and ran
// at about half the bandwidth of gemv_tile_t (benchmarks/NOTES.md).
//
// W is stored (K, M) row-major; a block owns BN = 8 BMC consecutive columns and its split of K,
// taken in stages of KR = 64 rows. A block is CW consumer warps and one producer warp, whose lane
// 0 arms a stage's `full` barrier with the stage's bytes and loads it: BN / 64 boxes of W (64
// columns x KR rows) and one box of x (KR values of k x 16 vectors), each 128 bytes a row with the
// TMA's 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)), so the eight rows of an
// ldmatrix matrix fall in eight bank groups. It waits on the stage's `empty` barrier (one arrival
// per consumer warp) before refilling it.
// Each consumer warp owns WN = BN / CW columns and every k of a stage: per 16 k, one ldmatrix.x4
// of x (the A fragment: 16 vectors x 16 k) and, per 16 columns, one ldmatrix.x4.trans of W (two B
// fragments), then mma.m16n8k16 with fp32 accumulation, as gemv_tile_t.
// The tensor maps end at M, K and the vector count, and the TMA fills what lies past them with
// zeros: columns past M, vectors past the block's and the last split's rows past K all add
// nothing. Splits other than the last hold whole stages.
//
// Requirements, checked by the launcher (which otherwise runs the CUDA-core kernel with the same
// columns per block): compute capability 9.0, 16-bit types, W and x 16-byte aligned, W's row and
// matrix strides and x's vector and matrix strides multiples of 16 bytes, and the ring within a
// block's shared memory.
#pragma once

#include "gemv_tile_t.cuh"
#include "tma.cuh"

namespace gemvx {
namespace kernels {

// The kernel's one argument: the tensor maps of W (2-byte elements: dims M, K, groups; box 64 x 64
// x 1) and x (dims K, vectors, groups; box 64 x 16 x 1), and the call. The maps must live in
// kernel parameter space (64-byte aligned).
struct TmaTArgs {
  CUtensorMap wmap, xmap;
  Args a;
};

constexpr int kTmaTRows = 64;  // rows of W (k) per stage: one 128-byte swizzled row of x per vector

// Dynamic shared memory of one block: S stages of BN / 64 boxes of W and one of x, and 1 KiB to
// align the ring to the 1024 bytes of the swizzle pattern.
template <int BMC, int S>
constexpr int tma_t_smem_bytes() {
  return S * (BMC / 8 * kTmaTRows * 128 + 16 * 128) + 1024;
}

template <typename T, int THREADS, int BMC, int S>
__global__ void __launch_bounds__(THREADS, 1) gemv_tma_t(const __grid_constant__ TmaTArgs p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int NV = 16;
  constexpr int CW = THREADS / 32 - 1;  // consumer warps; the last warp produces
  constexpr int BN = 8 * BMC;           // columns per block
  constexpr int WN = BN / CW;           // columns per consumer warp
  constexpr int KR = kTmaTRows;
  constexpr int BOX = KR * 128;         // bytes of one 64-column box of W
  constexpr int W_BYTES = BN / 64 * BOX;
  constexpr int STAGE = W_BYTES + NV * 128;
  static_assert(sizeof(T) == 2 && CW >= 1 && BN % 64 == 0 && BN % CW == 0 && WN % 16 == 0 && S >= 2,
                "gemv_tma_t: 16-bit types, whole boxes, 16-column pairs of tiles per consumer warp");
  extern __shared__ __align__(128) uint8_t tma_t_ring[];
  __shared__ __align__(8) uint64_t full[S], empty[S];
  const Args& a = p.a;

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const BlockWork<T, NV> bw(a);
  const int split = bw.split, nv = bw.nv;
  const int64_t g = bw.g, v0 = bw.v0;
  const int64_t col0 = int64_t(blockIdx.x) * BN;
  const int64_t k_begin = min(int64_t(split) * a.split_span, a.K);
  const int64_t k_end = min(k_begin + a.split_span, a.K);
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
      for (int64_t st = 0; st < steps; ++st) {
        const int s = int(st % S);
        const int64_t use = st / S;
        if (use > 0) tma::wait(empty0 + 8 * s, uint32_t(use - 1) & 1u);
        const int k0 = int(k_begin + st * KR);
        const uint32_t dst = ring + uint32_t(s) * STAGE, bar = full0 + 8 * s;
        tma::expect(bar, STAGE);
#pragma unroll
        for (int b = 0; b < BN / 64; ++b)
          tma::box_hint(dst + b * BOX, &p.wmap, int(col0) + 64 * b, k0, int(g), bar, policy);
        tma::box(dst + W_BYTES, &p.xmap, k0, int(v0), int(g), bar);
      }
    }
    pdl_trigger();
    return;
  }

  float acc[WN / 8][4];
#pragma unroll
  for (int j = 0; j < WN / 8; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;

  // ldmatrix rows of this lane: vector (A) or row of the 16-k step (B) l % 8 + 8 ((l / 8) % 2),
  // chunk + l / 16; the swizzle XORs the chunk with the row % 8 = l % 8.
  const int r16 = lane % 8 + 8 * ((lane / 8) % 2), sw = lane % 8, hi = lane / 16;
  const uint32_t xa = W_BYTES + 128 * r16;
  const uint32_t wb = 128 * r16;
  const int c0 = warp * (WN / 8) + hi;  // the warp's first 16-byte column chunk (of the block) + l / 16
#pragma unroll 1
  for (int64_t st = 0; st < steps; ++st) {
    const int s = int(st % S);
    tma::wait(full0 + 8 * s, uint32_t(st / S) & 1u);
    const uint32_t base = ring + uint32_t(s) * STAGE;
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
    __syncwarp();
    if (lane == 0) tma::arrive(empty0 + 8 * s);
  }
  pdl_trigger();

  // The outputs leave through shared memory where they can (16-byte rows of y): the ring is free
  // once every consumer warp is past its last stage (the producer loaded no more than that).
  constexpr int STAGED = 16 * (WN + 8) * int(sizeof(T));  // bytes per warp
  static_assert(CW * STAGED <= S * STAGE, "the staged outputs fit in the ring");
  if (rows_storable<T>(a)) {
    asm volatile("bar.sync 1, %0;" ::"r"(CW * 32) : "memory");
    T* stage = reinterpret_cast<T*>(tma_t_ring + (ring - tma::addr(tma_t_ring)) + warp * STAGED);
    store_tile_rows<T, WN>(a, g, v0, nv, col0 + warp * WN, acc, stage);
  } else {
    store_tile<T, WN>(a, split, g, v0, nv, col0 + warp * WN, acc);
  }
#endif
}

}  // namespace kernels
}  // namespace gemvx
