// Weight-only quantised GEMV, layout N: y = alpha * deq(W) x + beta * y_in.
//
// W is stored row-major as int8 (M, K), or as int4 packed two per byte along K (M, ceil(K/2))
// uint8 with the even k in the low nibble; each row has one scale per group of g consecutive k
// (g a power of two >= 32, or one group per row) and, for int4, an optional zero point per group
// (symmetric int4 stores q + 8, i.e. zero point 8). deq(W)[m, k] = (q - z) * s.
//
// Tensor cores do the multiply-add with fp32 accumulation. A warp owns 16 rows (the A tile of
// mma.m16n8k16) per m-tile and up to 8 vectors per n-tile (the B tile's 8 columns; columns with
// no vector are zero, so one vector costs the same as eight). Each lane streams 16-byte chunks of
// packed W (32 int4 or 16 int8 values of one row) for two rows (g and g + 8 of the tile); the four
// lanes of a quad (lane % 4) take consecutive chunks, P1 / 4 warps of the block take the next
// ones, so the block reads P1 * 16 contiguous bytes of a row per unrolled load.
//
// The order of k inside an mma does not matter as long as A and B agree, so each lane feeds the
// mma with the values of its own chunk in the order the bit tricks produce them, and builds its B
// fragment (x) in the same order: no shuffles between lanes.
//
// Dequantisation is lookup-free and exact: every code becomes the integer q - z in x's dtype.
//   int4: (w & 0x000F000F) | magic puts two nibbles into the mantissas of two halves of 1024.0
//         (fp16, 0x6400) or 128.0 (bf16, 0x4300), i.e. the values magic + q exactly, and one half2
//         subtraction of (magic + z) gives q - z. fp16 leaves the odd nibbles at bits 4..7 (the
//         value 1024 + 16 q) and takes them down with one exact half2 fma by 1/16, so a word of
//         8 codes costs one shift; bf16 (7 mantissa bits) shifts each nibble down.
//   int8: fp16: a byte permute places (b ^ 0x80) = b + 128 into the mantissa of 1024.0;
//         subtracting 1152 gives b exactly. bf16 has too few mantissa bits for 8-bit values, so
//         the byte goes into the mantissa of 2^23 (fp32), 2^23 + 128 is subtracted, and the exact
//         float is truncated to bf16 (exact: |b| <= 128 needs 8 significant bits).
// Scales: when a group spans at least the 4 chunks that a quad feeds into one mma (int4 g >= 128,
// int8 g >= 64, or one scale per row), the mmas take q - z and each chunk's fp32 tile is scaled
// in fp32 (POST): y = sum over groups of s * sum (q - z) x, all in fp32. Smaller groups scale
// every pair in x's dtype before the mma (one half2 multiply, the scale rounded to x's dtype once
// per group), so a weight enters the mma as round((q - z) * s).
//
// Full chunks are loaded with 16-byte stream loads (VEC, when W rows and x are 16-byte aligned)
// or byte / element loads otherwise; the last partial chunk of a row (K not a multiple of the
// chunk) is loaded element-wise by the last split, with x = 0 past K. Split-K and the fixed-order
// reduction across the warps of a block follow the dense row-major kernel.
#pragma once

#include <cstring>
#include <type_traits>

#include "../problem.h"
#include "common.cuh"

namespace gemvx {
namespace kernels {

// The dense arguments plus the quantisation metadata. In `a`, W is the packed matrix and ldw /
// w_group are in bytes; scale and zero strides are in elements.
struct QuantArgs {
  Args a;
  const void* scales;
  const uint8_t* zeros;  // null: symmetric (int8; int4 with the implicit zero point 8)
  int64_t lds, s_group;
  int64_t ldz, z_group;
  int32_t group_shift;  // group of element k = k >> group_shift (per-channel: 62, always 0)
  int32_t scale_dtype;  // DType code of the scales
};

// Everything the kernel indexes inside one row (k, bytes, chunks) is a 32-bit offset: the
// launcher refuses K >= 2^31 - 64.

__device__ __forceinline__ uint32_t bits_of(__half2 h) {
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}
__device__ __forceinline__ uint32_t bits_of(__nv_bfloat162 h) {
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}
__device__ __forceinline__ uint32_t bits_of(__half h) { return __half_as_ushort(h); }
__device__ __forceinline__ uint32_t bits_of(__nv_bfloat16 h) { return __bfloat16_as_ushort(h); }

// Arithmetic on pairs of x's dtype, held as 32-bit words, and the mma of that dtype.
template <typename T>
struct QuantMath;

// c += A (16 x 16, a0..a3) B (16 x 8, b0..b1), fp32 accumulators; AB is "f16" or "bf16".
#define GEMVX_MMA_16816(AB)                                                                        \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." AB "." AB                                  \
               ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"               \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                    \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))

// Subtraction and multiplication of pairs (T2 = __half2 or __nv_bfloat162) held in 32-bit words.
template <typename T2>
struct PairOps {
  static __device__ __forceinline__ T2 pair(uint32_t u) {
    T2 h;
    memcpy(&h, &u, 4);
    return h;
  }
  static __device__ __forceinline__ uint32_t sub(uint32_t a, uint32_t b) {
    return bits_of(__hsub2(pair(a), pair(b)));
  }
  static __device__ __forceinline__ uint32_t mul(uint32_t a, uint32_t b) {
    return bits_of(__hmul2(pair(a), pair(b)));
  }
  static __device__ __forceinline__ uint32_t fma(uint32_t a, uint32_t b, uint32_t c) {
    return bits_of(__hfma2(pair(a), pair(b), pair(c)));
  }
};

template <>
struct QuantMath<__half> : PairOps<__half2> {
  static constexpr uint32_t kMagic = 0x64006400u;  // (1024, 1024): ulp 1, room for 10 bits
  static __device__ __forceinline__ uint32_t splat(float v) { return bits_of(__float2half2_rn(v)); }
  // Biases for int4x8: (1024 + z) for the low nibbles, -(64 + z) for the high ones.
  static __device__ __forceinline__ void int4_bias(uint32_t zp, uint32_t& lo, uint32_t& hi) {
    lo = 0x64006400u + zp * 0x00010001u;  // 1024 + z (ulp 1), in both halves (no carry: z < 16)
    hi = 0xD400D400u + zp * 0x00100010u;  // -(64 + z) (ulp 1/16 in [64, 128))
  }
  // int4x8_offset's pairs are 1024 + 16 q: kOffsetScale (1024 + 16 q) - kOffsetBase = q.
  static constexpr float kOffsetScale = 1.0f / 16.0f, kOffsetBase = 64.0f;
  // A half's exponent bits, and those from which x takes the exact path (gemv_quant_tma.cuh):
  // only NaN and infinity (a round's sums of 128 halves stay far inside fp32).
  static constexpr uint32_t kExpMask = 0x7C00u, kBigExp = 0x7C00u;
  // Four signed bytes -> two pairs (k0, k1), (k2, k3), exact.
  static __device__ __forceinline__ void int8x4(uint32_t w, uint32_t (&p)[2]) {
    const uint32_t u = w ^ 0x80808080u;  // b + 128, as unsigned bytes
    constexpr uint32_t kBias = 0x64806480u;  // (1152, 1152) = 1024 + 128
    p[0] = sub(__byte_perm(u, 0x64646464u, 0x4140), kBias);
    p[1] = sub(__byte_perm(u, 0x64646464u, 0x4342), kBias);
  }
  static __device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint32_t b0, uint32_t b1) {
    GEMVX_MMA_16816("f16");
  }
};

template <>
struct QuantMath<__nv_bfloat16> : PairOps<__nv_bfloat162> {
  static constexpr uint32_t kMagic = 0x43004300u;  // (128, 128): ulp 1, room for 7 bits
  static __device__ __forceinline__ uint32_t splat(float v) {
    return bits_of(__float2bfloat162_rn(v));
  }
  // Bias for int4x8: (128 + z) (bf16 shifts every nibble down; no high-nibble bias).
  static __device__ __forceinline__ void int4_bias(uint32_t zp, uint32_t& lo, uint32_t& hi) {
    lo = 0x43004300u + zp * 0x00010001u;  // 128 + z (ulp 1), in both halves
    hi = 0u;
  }
  // int4x8_offset's pairs are 128 + 8 q: kOffsetScale (128 + 8 q) - kOffsetBase = q.
  static constexpr float kOffsetScale = 1.0f / 8.0f, kOffsetBase = 16.0f;
  // A bf16's exponent bits, and those from which x takes the exact path (gemv_quant_tma.cuh):
  // 2^112 and up (a round's sum of 128 values times offset codes below 2^8 stays below 2^127).
  static constexpr uint32_t kExpMask = 0x7F80u, kBigExp = 0x7780u;
  static __device__ __forceinline__ void int8x4(uint32_t w, uint32_t (&p)[2]) {
    const uint32_t u = w ^ 0x80808080u;
    float f[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)  // 2^23 + (b + 128), exactly; minus 2^23 + 128
      f[i] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440 + i)) - 8388736.0f;
    // the upper halves of the exact floats are their bf16 values
    p[0] = __byte_perm(__float_as_uint(f[0]), __float_as_uint(f[1]), 0x7632);
    p[1] = __byte_perm(__float_as_uint(f[2]), __float_as_uint(f[3]), 0x7632);
  }
  static __device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint32_t b0, uint32_t b1) {
    GEMVX_MMA_16816("bf16");
  }
};

// (w & MASK) | c in one LOP3. Written out because the compiler, seeing two constants, spends two
// LOP3s on it (a LOP3 takes one immediate); with c in a register it is one.
template <uint32_t MASK>
__device__ __forceinline__ uint32_t and_or(uint32_t w, uint32_t c) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(w), "n"(MASK), "r"(c));
  return r;
}

// One word of 8 int4 codes (k = 0..7, low nibble first) -> four pairs of (q - z), exact, in the
// order (0, 4), (1, 5), (2, 6), (3, 7). magic = Q::kMagic (held in a register by the caller);
// bias_lo / bias_hi come from Q::int4_bias for the zero point.
template <typename T>
__device__ __forceinline__ void int4x8(uint32_t w, uint32_t magic, uint32_t bias_lo, uint32_t bias_hi,
                                       uint32_t (&e)[4]) {
  using Q = QuantMath<T>;
  if constexpr (std::is_same_v<T, __half>) {
    // fp16 has 10 mantissa bits: the odd nibbles stay in place (bits 4..7, i.e. 16 q) and are
    // brought down by an exact fma with 1/16: (1024 + 16 q) / 16 - (64 + z) = q - z. One shift
    // per word instead of three.
    constexpr uint32_t kSixteenth = 0x2C002C00u;  // (1/16, 1/16)
    const uint32_t w8 = w >> 8;
    e[0] = Q::sub(and_or<0x000F000Fu>(w, magic), bias_lo);
    e[1] = Q::fma(and_or<0x00F000F0u>(w, magic), kSixteenth, bias_hi);
    e[2] = Q::sub(and_or<0x000F000Fu>(w8, magic), bias_lo);
    e[3] = Q::fma(and_or<0x00F000F0u>(w8, magic), kSixteenth, bias_hi);
  } else {
    // bf16 has 7: 16 q would reach the exponent, so every nibble is shifted down to bits 0..3.
#pragma unroll
    for (int j = 0; j < 4; ++j) e[j] = Q::sub(and_or<0x000F000Fu>(w >> (4 * j), magic), bias_lo);
  }
}

// The same word as four pairs of codes still offset, with no arithmetic: fp16 1024 + 16 q (each
// nibble moved to bits 4..7 of its half), bf16 128 + 8 q (bits 3..6), exact, in int4x8's order.
// Through the mmas, sum (q - z) x = kOffsetScale sum pair x - (kOffsetBase + z) sum x, which the
// caller applies in fp32 to a sum over few k (a 64-byte round). The offset, 64 + z code units
// (fp16; bf16 16 + z), is what costs bits of the fp32 sum; 1024 + q, the other place for the
// nibble, would put it at 1024 + z. Three shifts (bf16 four) and four LOP3s a word, against
// int4x8's one shift, four LOP3s and four half-pair adds (bf16 three, four and four).
template <typename T>
__device__ __forceinline__ void int4x8_offset(uint32_t w, uint32_t magic, uint32_t (&e)[4]) {
  if constexpr (std::is_same_v<T, __half>) {
    e[0] = and_or<0x00F000F0u>(w << 4, magic);
    e[1] = and_or<0x00F000F0u>(w, magic);
    e[2] = and_or<0x00F000F0u>(w >> 4, magic);
    e[3] = and_or<0x00F000F0u>(w >> 8, magic);
  } else {
    e[0] = and_or<0x00780078u>(w << 3, magic);
    e[1] = and_or<0x00780078u>(w >> 1, magic);
    e[2] = and_or<0x00780078u>(w >> 5, magic);
    e[3] = and_or<0x00780078u>(w >> 9, magic);
  }
}

// An int4 zero point at p (its low nibble), or 8 (symmetric) where load is false: zero_point_bits
// loads the byte as it is (a load made ahead of its use, masked with 15 when used: 8 & 15 == 8),
// zero_point masks it at once.
__device__ __forceinline__ uint32_t zero_point_bits(const uint8_t* p, bool load) {
  return load ? uint32_t(__ldg(p)) : 8u;
}
__device__ __forceinline__ uint32_t zero_point(const uint8_t* p, bool load) {
  return zero_point_bits(p, load) & 15u;
}

// The scale dtype of a launch as three bit masks, all ones for the dtype the scales have.
struct ScaleKind {
  uint32_t f32, bf16, f16;
  __device__ __forceinline__ explicit ScaleKind(int32_t dtype) {
    f32 = dtype == int32_t(DType::kFloat32) ? ~0u : 0u;
    bf16 = dtype == int32_t(DType::kBFloat16) ? ~0u : 0u;
    f16 = ~(f32 | bf16);
    // opaque: the compiler would otherwise turn the masks below back into branches
    asm("" : "+r"(f32), "+r"(bf16), "+r"(f16));
  }
};

// The scale at byte address p (4 bytes for float32, else 2) as fp32, without branches, so that
// the loads of a step issue together: scale_bits loads the raw bits, scale_value converts them.
// Apart, so that a load made ahead of its use is not waited for until the value is needed.
__device__ __forceinline__ uint32_t scale_bits(const char* p, const ScaleKind& k) {
  return k.f32 ? __ldg(reinterpret_cast<const unsigned int*>(p))
               : uint32_t(__ldg(reinterpret_cast<const unsigned short*>(p)));
}
__device__ __forceinline__ float scale_value(uint32_t u, const ScaleKind& k) {
  const uint32_t h = __float_as_uint(__half2float(__ushort_as_half((unsigned short)(u & 0xFFFFu))));
  return __uint_as_float((u & k.f32) | ((u << 16) & k.bf16) | (h & k.f16));
}
__device__ __forceinline__ float scale_at(const char* p, const ScaleKind& k) {
  return scale_value(scale_bits(p, k), k);
}

// Hides how p was computed, so the compiler keeps the pointer in a register instead of computing
// it again from the row index in every step of the loop.
template <typename P>
__device__ __forceinline__ P* opaque(P* p) {
  asm("" : "+l"(p));
  return p;
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Eight values of x, k = 0..7 as four words of pairs (a: 0, 1; b: 2, 3; c: 4, 5; d: 6, 7), in the
// k order of int4's dequantised pairs: (0, 4), (1, 5), (2, 6), (3, 7).
__device__ __forceinline__ uint4 int4_pair_order(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  return make_uint4(__byte_perm(a, c, 0x5410), __byte_perm(a, c, 0x7632), __byte_perm(b, d, 0x5410),
                    __byte_perm(b, d, 0x7632));
}

// The B fragments (x) of a 16-byte chunk of packed W, in the k order of its dequantised A pairs:
// xw holds the chunk's E values of one vector in k order (int4: 32 values, 16 words; int8: 16, 8);
// b[i] is the (b0, b1) of the chunk's mma i.
template <int BITS>
__device__ __forceinline__ void b_fragments(const uint32_t (&xw)[BITS == 4 ? 16 : 8], uint32_t (&b)[BITS == 4 ? 8 : 4][2]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (BITS == 4) {  // W word i covers k = 8i..8i+7; pairs (8i+j, 8i+j+4)
      const uint4 o = int4_pair_order(xw[4 * i], xw[4 * i + 1], xw[4 * i + 2], xw[4 * i + 3]);
      b[2 * i][0] = o.x;
      b[2 * i][1] = o.y;
      b[2 * i + 1][0] = o.z;
      b[2 * i + 1][1] = o.w;
    } else {  // W word i covers k = 4i..4i+3; pairs (4i, 4i+1), (4i+2, 4i+3)
      b[i][0] = xw[2 * i];
      b[i][1] = xw[2 * i + 1];
    }
  }
}

// Word i of a chunk of rows g and g + 8 (wl, wh) as exact pairs of q - z in x's dtype: lo for row
// g, hi for row g + 8; int4 four pairs each (biases from Q::int4_bias, per row), int8 two.
template <typename T, int BITS>
__device__ __forceinline__ void dequant_word(uint32_t wl, uint32_t wh, uint32_t magic, const uint32_t (&blo)[2],
                                             const uint32_t (&bhi)[2], uint32_t (&lo)[BITS == 4 ? 4 : 2],
                                             uint32_t (&hi)[BITS == 4 ? 4 : 2]) {
  if constexpr (BITS == 4) {
    int4x8<T>(wl, magic, blo[0], bhi[0], lo);
    int4x8<T>(wh, magic, blo[1], bhi[1], hi);
  } else {
    QuantMath<T>::int8x4(wl, lo);
    QuantMath<T>::int8x4(wh, hi);
  }
}

// dequant_word with int4's codes still offset (int4x8_offset); int4 only.
template <typename T, int BITS>
__device__ __forceinline__ void dequant_word_offset(uint32_t wl, uint32_t wh, uint32_t magic,
                                                    uint32_t (&lo)[BITS == 4 ? 4 : 2],
                                                    uint32_t (&hi)[BITS == 4 ? 4 : 2]) {
  if constexpr (BITS == 4) {
    int4x8_offset<T>(wl, magic, lo);
    int4x8_offset<T>(wh, magic, hi);
  }
}

// The mmas of word i of a chunk (pairs from dequant_word, B fragments from b_fragments): int4's
// two into c0 and c1 (two chains of dependent mmas where they differ), int8's one into c0.
template <typename T, int BITS>
__device__ __forceinline__ void word_mmas(float (&c0)[4], float (&c1)[4], const uint32_t (&lo)[BITS == 4 ? 4 : 2],
                                          const uint32_t (&hi)[BITS == 4 ? 4 : 2],
                                          const uint32_t (&b)[BITS == 4 ? 8 : 4][2], int i) {
  using Q = QuantMath<T>;
  if constexpr (BITS == 4) {
    Q::mma(c0, lo[0], hi[0], lo[1], hi[1], b[2 * i][0], b[2 * i][1]);
    Q::mma(c1, lo[2], hi[2], lo[3], hi[3], b[2 * i + 1][0], b[2 * i + 1][1]);
  } else {
    Q::mma(c0, lo[0], hi[0], lo[1], hi[1], b[i][0], b[i][1]);
  }
}
template <typename T, int BITS>
__device__ __forceinline__ void word_mmas(float (&c)[4], const uint32_t (&lo)[BITS == 4 ? 4 : 2],
                                          const uint32_t (&hi)[BITS == 4 ? 4 : 2],
                                          const uint32_t (&b)[BITS == 4 ? 8 : 4][2], int i) {
  word_mmas<T, BITS>(c, c, lo, hi, b, i);
}

// How the scales are applied; the launcher picks from the group size (and alignment).
//   kPre:   every weight pair is scaled in x's dtype before the mma (any group size; the only mode
//           of the unaligned variant).
//   kGroup: the group spans the 4 chunks a quad feeds into one mma: the mmas take the exact
//           integers q - z and each chunk's tile is scaled in fp32 (acc += s * tile), one FFMA
//           per accumulator instead of a half2 multiply per weight pair.
//   kRow:   one scale (and zero point) per row: loaded once, the sum of q - z times x is scaled
//           at the end.
enum class Scaling { kPre, kGroup, kRow };

// The loop is software-pipelined: the next step's chunks (W, scales, zero points) are loaded
// into a second set of registers before the current step's math.
template <typename T, int BITS, int THREADS, int P1, int R, int U, int NV, bool VEC, Scaling S>
__global__ void __launch_bounds__(THREADS) gemv_quant(const QuantArgs q) {
  static_assert(BITS == 4 || BITS == 8, "int4 or int8 weights");
  static_assert(P1 % 4 == 0 && (THREADS / 32) % (P1 / 4) == 0, "P1 / 4 warps must divide the block");
  static_assert(NV % 8 == 0, "vectors come in n-tiles of 8");
  static_assert(VEC || S == Scaling::kPre, "the unaligned variant scales before the mma");
  using Q = QuantMath<T>;
  constexpr int WK = P1 / 4;                // warps that split K for the same rows
  constexpr int ROW_WARPS = THREADS / 32 / WK;
  constexpr int ROWS = ROW_WARPS * 16 * R;  // rows per block
  constexpr int NB = NV / 8;                // n-tiles
  constexpr int E = BITS == 4 ? 32 : 16;    // K values per 16-byte chunk
  constexpr int XQ = E * 2 / 16;            // 16-byte pieces of x per chunk
  constexpr int MMAS = BITS == 4 ? 8 : 4;   // mmas per chunk, m-tile and n-tile
  const Args& a = q.a;
  pdl_wait();

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int gq = lane / 4;  // row of the A tile (and g + 8), column of the B tile
  const int t = lane % 4;   // position in the quad: owns k-slots 2t, 2t+1, 2t+8, 2t+9 of each mma
  const int wk = warp % WK;
  const int wr = warp / WK;
  const int L = wk * 4 + t;  // this lane's position among the P1 lanes that walk a row
  const int split = blockIdx.y;
  const int64_t z = a.z_offset + blockIdx.z;
  const int64_t g = z / a.vchunks;
  const int64_t v0 = (z % a.vchunks) * NV;
  const int nv = int(a.nvec - v0 < NV ? a.nvec - v0 : NV);

  const uint8_t* W = static_cast<const uint8_t*>(a.W) + g * a.w_group;
  const T* X = static_cast<const T*>(a.x) + g * a.x_group + v0 * a.x_vec;
  const int row_bytes = int(BITS == 4 ? (a.K + 1) / 2 : a.K);
  // Scales: fp32 or 16-bit, addressed in bytes; the group of chunk c is c >> chunk_shift (31 for
  // one scale per row: always group 0).
  const ScaleKind sk(q.scale_dtype);
  const int s_shift = q.scale_dtype == int32_t(DType::kFloat32) ? 2 : 1;
  const int chunk_shift = min(q.group_shift - (BITS == 4 ? 5 : 4), 31);
  const bool has_zeros = q.zeros != nullptr;

  // Rows past M read the last row (in bounds, never stored). [rt][0]: row g, [rt][1]: row g + 8.
  int64_t row[R][2];
  const uint8_t* wrow[R][2];
  const char* srow[R][2];
  const uint8_t* zrow[R][2];
#pragma unroll
  for (int rt = 0; rt < R; ++rt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row[rt][h] = int64_t(blockIdx.x) * ROWS + (wr * R + rt) * 16 + gq + 8 * h;
      const int64_t r = row[rt][h] < a.M ? row[rt][h] : a.M - 1;
      wrow[rt][h] = opaque(W + r * a.ldw);
      srow[rt][h] = opaque(static_cast<const char*>(q.scales) + ((g * q.s_group + r * q.lds) << s_shift));
      zrow[rt][h] = opaque(has_zeros ? q.zeros + g * q.z_group + r * q.ldz : q.zeros);
    }
  // This lane's B columns: vectors gq and gq + 8 (n-tile 1). Every x load returns 16 bytes to
  // each active lane through the L1 data path, which W and x share; int4 moves twice as many x
  // bytes as W bytes, so there lanes whose column has no vector load nothing (zeros; a batch of
  // one moves an eighth of the x traffic of eight). int8 moves as many x bytes as W bytes; there
  // every lane loads (columns past nvec read the first vector: a column of B only reaches the
  // same column of C, which is not stored), which keeps its registers, and its blocks per SM, down.
  constexpr bool SKIP_X = BITS == 4;
  bool has_x[NB];
  const T* xv[NB];
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
    const int v = nb * 8 + gq;
    has_x[nb] = v < nv;
    xv[nb] = opaque(X + int64_t(has_x[nb] ? v : 0) * a.x_vec);
  }

  // kRow: the rows' one scale and zero point (group 0).
  float row_s[R][2];
  uint32_t row_blo[R][2], row_bhi[R][2];
  if constexpr (S == Scaling::kRow) {
#pragma unroll
    for (int rt = 0; rt < R; ++rt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        row_s[rt][h] = scale_at(srow[rt][h], sk);
        if constexpr (BITS == 4)
          Q::int4_bias(zero_point(zrow[rt][h], has_zeros), row_blo[rt][h], row_bhi[rt][h]);
      }
  }
  const uint32_t magic = Q::kMagic;

  // Two accumulator sets per tile (even and odd words of a chunk) halve the chain of dependent
  // mmas; they are added at the end.
  float acc[R][NB][2][4];
#pragma unroll
  for (int rt = 0; rt < R; ++rt)
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[rt][nb][j / 4][j % 4] = 0.0f;

  // One chunk of this lane: the packed W of two rows per m-tile, their scales and zero points.
  // Scales and zero points stay as loaded until the chunk is consumed (scale_value, the low
  // nibble): converted where they were loaded, they made the warp wait for those loads before it
  // consumed the step before (benchmarks/NOTES.md).
  struct Chunk {
    uint4 w[R][2];
    uint32_t s[R][2];   // scale bits, 0 (scale 0 in every dtype) where not valid
    uint32_t zp[R][2];  // zero-point byte, 8 where none
  };
  const uint4 zero4 = make_uint4(0u, 0u, 0u, 0u);

  // Loads chunk c (if `valid`) and the scales / zero points of the group of chunk sc (if
  // `svalid`; kGroup: the quad's first chunk, whose group the whole quad shares). EDGE: the last,
  // partial chunk of the rows (element loads, zeros past K).
  auto fetch_meta = [&](Chunk& ch, int sc, bool svalid) {
    if constexpr (S != Scaling::kRow) {
      const int grp = sc >> chunk_shift;
#pragma unroll
      for (int rt = 0; rt < R; ++rt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          ch.s[rt][h] = svalid ? scale_bits(srow[rt][h] + (grp << s_shift), sk) : 0u;
          if constexpr (BITS == 4)
            ch.zp[rt][h] = zero_point_bits(zrow[rt][h] + grp, svalid && has_zeros);
        }
    }
  };
  auto fetch = [&](Chunk& ch, int c, bool valid, int sc, bool svalid, bool edge) {
    fetch_meta(ch, sc, svalid);
#pragma unroll
    for (int rt = 0; rt < R; ++rt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (!valid) {
          ch.w[rt][h] = zero4;
        } else if (VEC && !edge) {
          ch.w[rt][h] = load_stream(reinterpret_cast<const uint4*>(wrow[rt][h]) + c);
        } else {
          uint32_t wd[4] = {0u, 0u, 0u, 0u};
#pragma unroll
          for (int b = 0; b < 16; ++b) {
            const int i = c * 16 + b;
            if (!edge || i < row_bytes) wd[b / 4] |= uint32_t(__ldg(wrow[rt][h] + i)) << (8 * (b % 4));
          }
          ch.w[rt][h] = make_uint4(wd[0], wd[1], wd[2], wd[3]);
        }
      }
  };

  // x for chunk c of this lane's vectors (zeros where `valid` is false or past K), loaded when the
  // chunk is consumed: it is small and hot in L1, and keeping it out of the pipelined registers
  // leaves room for more W in flight.
  auto fetch_x = [&](uint4 (&xq)[NB][XQ], int c, bool valid, bool edge) {
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      if (!valid || (SKIP_X && !has_x[nb])) {
#pragma unroll
        for (int i = 0; i < XQ; ++i) xq[nb][i] = zero4;
      } else if (VEC && !edge) {
#pragma unroll
        for (int i = 0; i < XQ; ++i) xq[nb][i] = load_keep(reinterpret_cast<const uint4*>(xv[nb] + c * E) + i);
      } else {
        uint32_t xw[E / 2];
#pragma unroll
        for (int e = 0; e < E; e += 2) {
          const int k = c * E + e;
          const uint32_t lo = !edge || k < a.K ? bits_of(load_keep(xv[nb] + k)) : 0u;
          const uint32_t hi = !edge || k + 1 < a.K ? bits_of(load_keep(xv[nb] + k + 1)) : 0u;
          xw[e / 2] = lo | (hi << 16);
        }
#pragma unroll
        for (int i = 0; i < XQ; ++i) xq[nb][i] = make_uint4(xw[4 * i], xw[4 * i + 1], xw[4 * i + 2], xw[4 * i + 3]);
      }
    }
  };

  // Dequantises a chunk and runs its mmas.
  auto consume = [&](const Chunk& ch, int c, bool valid, bool edge) {
    uint4 xq[NB][XQ];
    fetch_x(xq, c, valid, edge);
    // B fragments, in the k order of the A pairs.
    uint32_t b[NB][MMAS][2];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      uint32_t xw[4 * XQ];
#pragma unroll
      for (int i = 0; i < 4 * XQ; ++i) xw[i] = word_of(xq[nb][i / 4], i % 4);
      b_fragments<BITS>(xw, b[nb]);
    }
#pragma unroll
    for (int rt = 0; rt < R; ++rt) {
      uint32_t s2[2], bias_lo[2], bias_hi[2];
      float sc[2] = {1.0f, 1.0f};  // the rows' scales of this chunk (kPre, kGroup)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (S != Scaling::kRow) sc[h] = scale_value(ch.s[rt][h], sk);
        if constexpr (S == Scaling::kPre) s2[h] = Q::splat(sc[h]);
        if constexpr (BITS == 4 && S == Scaling::kRow) {
          bias_lo[h] = row_blo[rt][h];
          bias_hi[h] = row_bhi[rt][h];
        } else if constexpr (BITS == 4) {
          Q::int4_bias(ch.zp[rt][h] & 15u, bias_lo[h], bias_hi[h]);
        }
      }
      // kGroup: this chunk's tile, scaled into acc below; otherwise the mmas add into acc.
      float tile[NB][2][4];
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int j = 0; j < 8; ++j) tile[nb][j / 4][j % 4] = 0.0f;
      auto target = [&](int nb, int i) -> float(&)[4] {
        return S == Scaling::kGroup ? tile[nb][i % 2] : acc[rt][nb][i % 2];
      };
      // kPre: the pairs of rows g and g + 8 times their scales, in x's dtype.
      auto prescale = [&](auto& lo, auto& hi) {
        if constexpr (S == Scaling::kPre) {
#pragma unroll
          for (int j = 0; j < int(sizeof(lo) / sizeof(lo[0])); ++j) {
            lo[j] = Q::mul(lo[j], s2[0]);
            hi[j] = Q::mul(hi[j], s2[1]);
          }
        }
      };
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t lo[MMAS / 2], hi[MMAS / 2];
        dequant_word<T, BITS>(word_of(ch.w[rt][0], i), word_of(ch.w[rt][1], i), magic, bias_lo, bias_hi, lo, hi);
        prescale(lo, hi);
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) word_mmas<T, BITS>(target(nb, i), lo, hi, b[nb], i);
      }
      if constexpr (S == Scaling::kGroup) {
        // C fragment: [0..1] row g, [2..3] row g + 8.
#pragma unroll
        for (int nb = 0; nb < NB; ++nb)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[rt][nb][0][j] = fmaf(sc[j / 2], tile[nb][0][j] + tile[nb][1][j], acc[rt][nb][0][j]);
      }
    }
  };

  // Full chunks of this split, in steps of UL chunks per lane; every lane of the warp runs the
  // same number of steps (mma.sync is warp-collective), lanes without a chunk feed zeros. A quad
  // (4 lanes) takes 4 consecutive chunks starting at a multiple of 4 (split spans are multiples
  // of P1), so with kGroup its chunks share one group.
  const int nfull = int(a.K / E);
  const int c_begin = int(min(int64_t(split) * a.split_span, int64_t(nfull)));
  const int c_end = int(min(c_begin + a.split_span, int64_t(nfull)));
  // The unaligned variant (byte loads) keeps one chunk per step: its loads are many and narrow.
  constexpr int UL = VEC ? U : 1;
  constexpr int STEP = P1 * UL;
  auto fetch_step = [&](Chunk (&ch)[UL], int cb) {
#pragma unroll
    for (int u = 0; u < UL; ++u) {
      // kGroup: c has the group of its quad's first chunk c - t (groups span whole quads)
      const int c = cb + u * P1 + L;
      fetch(ch[u], c, true, c, true, false);
    }
  };
  auto consume_step = [&](const Chunk (&ch)[UL], int cb) {
#pragma unroll
    for (int u = 0; u < UL; ++u) consume(ch[u], cb + u * P1 + L, true, false);
  };
  int cb = c_begin;
  int steps = (c_end - c_begin) / STEP;
  if (steps > 0) {
    // Two register sets in turn: `cur` holds the step at cb, `next` receives the one after it
    // while `cur` is consumed; true when the split's last full step is done.
    Chunk ca[UL], cbuf[UL];
    auto step = [&](Chunk (&cur)[UL], Chunk (&next)[UL]) {
      if (steps > 1) fetch_step(next, cb + STEP);
      consume_step(cur, cb);
      cb += STEP;
      return --steps == 0;
    };
    fetch_step(ca, cb);
#pragma unroll 1
    while (!step(ca, cbuf) && !step(cbuf, ca)) {
    }
  }
  for (; cb < c_end; cb += P1) {
    Chunk ch;
    const int c = cb + L;
    const int sc = S == Scaling::kGroup ? c - t : c;
    fetch(ch, c, c < c_end, sc, sc < c_end, false);
    consume(ch, c, c < c_end, false);
  }
  pdl_trigger();
  // The partial chunk at the end of the rows, once, by the first warp of each row slice of the
  // last split (its quad shares the chunk's group).
  if (nfull * E < a.K && split == a.splits - 1 && wk == 0) {
    Chunk ch;
    fetch(ch, nfull, t == 0, nfull, true, true);
    consume(ch, nfull, t == 0, true);
  }
  // f(rt, nb, j) for every accumulator of this lane's C tiles (j: its 4 values per n-tile).
  auto each_acc = [&](auto&& f) {
#pragma unroll
    for (int rt = 0; rt < R; ++rt)
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int j = 0; j < 4; ++j) f(rt, nb, j);
  };
  each_acc([&](int rt, int nb, int j) {
    acc[rt][nb][0][j] += acc[rt][nb][1][j];
    if constexpr (S == Scaling::kRow) acc[rt][nb][0][j] *= row_s[rt][j / 2];
  });

  if constexpr (WK > 1) {
    // Warps 1..WK-1 of a row slice hand their tiles to warp 0, which adds them in a fixed order.
    __shared__ float red[ROW_WARPS][WK - 1][R * NB * 4][32];
    if (wk > 0)
      each_acc([&](int rt, int nb, int j) { red[wr][wk - 1][(rt * NB + nb) * 4 + j][lane] = acc[rt][nb][0][j]; });
    __syncthreads();
    if (wk > 0) return;
#pragma unroll
    for (int w = 0; w < WK - 1; ++w)
      each_acc([&](int rt, int nb, int j) { acc[rt][nb][0][j] += red[wr][w][(rt * NB + nb) * 4 + j][lane]; });
  }

  // C tile: acc[..][0..1] are row g, columns 2t and 2t+1; acc[..][2..3] the same for row g + 8.
  each_acc([&](int rt, int nb, int j) {
    const int64_t m = row[rt][j / 2];
    const int v = nb * 8 + 2 * t + (j % 2);
    if (m < a.M && v < nv) store_output<T>(a, split, g, v0 + v, m, acc[rt][nb][0][j]);
  });
}

}  // namespace kernels
}  // namespace gemvx

#undef GEMVX_MMA_16816
