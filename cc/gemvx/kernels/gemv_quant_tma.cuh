// Weight-only quantised GEMV, layout N, Hopper (sm_90) only: int8 or int4 W (the formats of
// gemv_quant.cuh) with one scale per row or one per group of at least a 64-byte round of a row,
// streamed through shared memory by the tensor memory accelerator (TMA), so the bytes in flight
// cost no registers and every request covers whole 128-byte lines.
//
// A block is CW consumer warps and one producer warp. The consumer warps form TG = CW / WT groups
// of WT; each group owns 16-row tiles of W (the A tile of mma.m16n8k16), taken in turn over the
// grid (tile = n * gridDim.x * TG + group * gridDim.x + blockIdx.x in round n, so the last round
// spreads over every block). Warp w of a group takes the tile's stages w, w + WT, ... (WT > 1
// puts more warps on each tile where the tiles are too few to give every warp one), and warps
// 1..WT-1 hand their C tiles to warp 0 through shared memory (a named barrier per group), which
// adds them in a fixed order and stores. Each consumer warp has a ring of S stages in shared
// memory; a stage is SK bytes of its tile's 16 rows, one 2D TMA box. One thread of the producer
// warp fills every warp's ring, the j-th stage of all warps before the (j + 1)-th, and waits on a
// stage's `empty` barrier before refilling it; a consumer waits on the stage's `full` barrier
// (armed with the box's byte count), runs its mmas (four chains of dependent mmas), and arrives
// on `empty`.
// The block's x (its split of K, for up to 8 vectors) is copied into shared memory once at the
// start and stays there (int8 with one bfloat16 vector of a short enough split: the consumer warps
// read it themselves, see x_to_fp16); past K it is zero, as is W (the tensor map fills boxes past
// its bounds with zeros), so the last partial stage adds nothing. int4 puts x into the k order of
// the B fragments once, after the copy (gemv_quant builds the fragments with byte permutes every
// step).
//
// The math is gemv_quant's (kernels/gemv_quant.cuh): in each 64-byte round of a stage, each lane
// dequantises the 16-byte chunk of rows g and g + 8 at byte 16 t into exact integers q - z in the
// math's dtype (MT), B holds x in the same k order, the mmas accumulate in fp32. MT is x's dtype,
// but for int8 with bfloat16 x: there x is turned into fp16 in shared memory once, each vector
// scaled by a power of two (x_to_fp16 below), and each output unscaled by it, so the call costs
// what an fp16 call does (bf16's int8 dequantisation takes eleven instructions a word, fp16's
// five). int4 keeps bf16's math: its dequantisation costs bf16 little more (eleven against
// nine), and the conversion, which every block makes of its whole x, cost the shapes with few
// tiles a block more than it saved (benchmarks/NOTES.md). Per-row scales multiply the
// tile's sum at the end (kRow). Group scales (kGroup: a group spans whole rounds) are loaded one
// stage ahead and applied in fp32 to sums of whole rounds, in one of two ways (Mode below): with
// one vector, round r of every 8 writes only C column r (the other columns' B fragments read
// zeros), so one FFMA per accumulator scales 8 rounds, and int4 with zero points takes its codes
// into the mmas still offset (no dequantisation arithmetic), taking the offset and the zero
// points out in fp32 with the round's x sum; with more vectors each round's own tile is scaled. A
// lane's B column is vector g of the block's (vector 0 again where g >= nv; those columns are
// not stored).
//
// Requirements, checked by the launcher (which otherwise runs gemv_quant): compute capability 9.0,
// W and x 16-byte aligned, packed rows of whole 8 bytes (int8: K % 8 == 0; int4: K % 16 == 0),
// W's row and matrix strides multiples of 16 bytes, x's vector and group strides multiples of 8
// elements, and the ring plus the block's x within the shared memory of a block.
#pragma once

#include <cuda.h>

#include "gemv_quant.cuh"
#include "tma.cuh"

namespace gemvx {
namespace kernels {

// The kernel's one argument: the tensor map over W (8-byte elements: dims row bytes / 8, M,
// groups) and the quantised arguments. The map must live in kernel parameter space (64-byte
// aligned).
struct QuantTmaArgs {  // 64-byte aligned, as CUtensorMap is
  CUtensorMap map;
  QuantArgs q;
  int32_t x_elems;  // elements of x per vector in shared memory: whole stages covering any split
  int32_t prefetch;  // 1: each consumer warp asks L2 for its first stage before pdl_wait
};

// Vectors per block (one mma n-tile).
constexpr int kQuantTmaNV = 8;

// Whether a launch has a block that sums x over its rounds (Mode kColumnsZ below: group scales,
// int4 with zero points, a block of one vector: the last block where nvec % kQuantTmaNV == 1).
constexpr bool quant_tma_round_sums(Scaling sc, int bits, bool zeros, int64_t nvec) {
  return sc == Scaling::kGroup && bits == 4 && zeros && nvec % kQuantTmaNV == 1;
}

// Dynamic shared memory of a launch: the rings, nv vectors of x_elems elements, for WT > 1 two
// rounds of the partial C tiles (16 bytes a lane) that warps 1..WT-1 of a tile hand over, 64
// bytes of zeros, and with round_sums the fp32 sum of x over each 64-byte round of W (VPB =
// values per byte of W).
template <typename T, int CW, int SK, int S, int WT, int VPB>
constexpr std::size_t quant_tma_smem(int nv, int x_elems, bool round_sums) {
  return std::size_t(CW) * S * 16 * SK + std::size_t(nv) * x_elems * sizeof(T) +
         std::size_t(2) * (CW / WT) * (WT - 1) * 32 * 16 + 64 +
         (round_sums ? std::size_t(x_elems) / (64 * VPB) * sizeof(float) : 0);
}


template <typename T, int BITS, int THREADS, int SK, int S, int WT, Scaling SC>
__global__ void __launch_bounds__(THREADS) gemv_quant_tma(const __grid_constant__ QuantTmaArgs p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int CW = THREADS / 32 - 1;  // consumer warps; the last warp produces
  constexpr int TG = CW / WT;           // tiles a block works on at once (WT warps each)
  constexpr int NV = kQuantTmaNV;
  constexpr int WSTAGE = 16 * SK;       // bytes of one stage: SK bytes of 16 rows
  constexpr int ROUNDS = SK / 64;       // quad steps of 64 bytes per stage
  constexpr int VPB = 8 / BITS;         // values per byte of W
  constexpr int XQ = 2 * VPB;           // 16-byte pieces of x per 16-byte chunk of W
  constexpr int MMAS = 4 * VPB;         // mmas per chunk
  static_assert(CW >= 1 && SK % 128 == 0 && SK <= 2048 && S >= 2, "SK: 128..2048 bytes, two stages or more");
  static_assert(CW % WT == 0 && (WT == 1 || TG <= 14), "WT divides the consumer warps; barriers 2..15");
  static_assert(SC == Scaling::kRow || SC == Scaling::kGroup, "scales per row or per group of whole rounds");
  constexpr bool kConvertX = BITS == 8 && std::is_same_v<T, __nv_bfloat16>;  // see x_to_fp16
  using MT = std::conditional_t<kConvertX, __half, T>;  // the consumers' math
  using Q = QuantMath<MT>;
  extern __shared__ __align__(128) uint8_t quant_tma_ring[];
  uint8_t* const smem = quant_tma_ring;
  __shared__ __align__(8) uint64_t full[CW][S], empty[CW][S], x_ready, sums_ready;
  __shared__ uint32_t x_exp[NV];  // bf16 x: the largest exponent field of each vector's split
  const QuantArgs& q = p.q;
  const Args& a = q.a;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int split = blockIdx.y;
  const int64_t z = a.z_offset + blockIdx.z;
  const int64_t g = z / a.vchunks;
  const int64_t v0 = (z % a.vchunks) * NV;
  const int nv = int(a.nvec - v0 < NV ? a.nvec - v0 : NV);
  // This split's bytes of each row: [k0, k0 + klen), in stages of SK. Spans count whole 16-byte
  // chunks, so the last split also takes the partial chunk at the end of a row; spans are rounded
  // up to whole stages, so the last splits may be empty (they store zero partial sums).
  const int64_t row_bytes = a.K / VPB;
  const int64_t k0 = int64_t(split) * a.split_span * 16;
  const int64_t rest = row_bytes - k0;
  const int klen = int(max(int64_t(0), split == a.splits - 1 ? rest : min(rest, a.split_span * 16)));
  const int xlen = klen * VPB;  // values of x in this split
  const int nst = (klen + SK - 1) / SK;
  // Warp w of a tile (w < WT) takes the tile's stages w, w + WT, ...: ns(w) of them.
  auto ns = [&](int w) { return nst > w ? (nst - w + WT - 1) / WT : 0; };
  const int64_t tiles = (a.M + 15) / 16;
  // Tile of group tg of this block in round n: rounds spread over every block.
  const int64_t per_round = int64_t(gridDim.x) * TG;
  auto tile_of = [&](int64_t n, int tg) { return n * per_round + int64_t(tg) * gridDim.x + blockIdx.x; };
  // Tile groups of this block with no tile at all: the last ones, where the tiles are fewer than the
  // grid's groups. With one vector and zero points (kColumnsZ) their warps sum x over its rounds
  // while the others start their stages.
  int spare = 0;
#pragma unroll
  for (int i = 0; i < TG; ++i) spare += tile_of(0, i) >= tiles ? 1 : 0;
  T* xs = reinterpret_cast<T*>(smem + std::size_t(CW) * S * WSTAGE);
  // int8 with one bf16 vector of at most kXRegs 16-byte pieces a consumer thread: the consumers
  // read x from global memory into registers and write it to shared memory as fp16 (x_to_fp16),
  // and the producer copies none.
  constexpr int kXRegs = 8;
  const bool x_regs = kConvertX && nv == 1 && xlen <= kXRegs * 8 * CW * 32;
  // The block's x in global memory: its first vector's values of this split. Taken where it is
  // used (by the producer, or by the consumers in x_to_fp16), not held across the kernel.
  auto x_global = [&] { return static_cast<const T*>(a.x) + g * a.x_group + v0 * a.x_vec + k0 * VPB; };

  // Where the launch overlaps the previous kernel (PDL) and K is not split (the launcher's
  // choice), each consumer warp's first box is asked of L2 before the wait, so the first round
  // trip to DRAM overlaps that kernel's tail. Safe whatever that kernel writes: L2 is the point
  // of coherence, and nothing reaches shared memory before the wait. One box a warp; two cost
  // more than they saved (benchmarks/NOTES.md).
  if (p.prefetch && warp < CW && lane == 0 && nst > warp % WT) {
    const int64_t tile = tile_of(0, warp / WT);
    if (tile < tiles) tma::prefetch_box(&p.map, int(k0 / 8) + (warp % WT) * (SK / 8), int(tile * 16), int(g));
  }
  if (threadIdx.x == 0) {
    for (int w = 0; w < CW; ++w)
      for (int s = 0; s < S; ++s) {
        tma::init(tma::addr(&full[w][s]), 1);
        tma::init(tma::addr(&empty[w][s]), 1);
      }
    tma::init(tma::addr(&x_ready), 1);
    tma::init(tma::addr(&sums_ready), uint32_t(spare > 0 ? spare * WT * 32 : 1));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // WT > 1: the partial C tiles of warps 1..WT-1 of each tile, two rounds apart, after the x;
  // then 64 bytes of zeros that group scales with one vector read in place of x (kColumns).
  float4* const red = reinterpret_cast<float4*>(xs + nv * p.x_elems);
  uint32_t* const zeros64 = reinterpret_cast<uint32_t*>(red + 2 * TG * (WT - 1) * 32);
  const T* const zx = reinterpret_cast<const T*>(zeros64);
  float* const xsum = reinterpret_cast<float*>(zeros64 + 16);  // kColumnsZ: x summed per round
  if (threadIdx.x < 16) zeros64[threadIdx.x] = 0u;
  if (threadIdx.x < NV) x_exp[threadIdx.x] = 0u;
  // x past this split's K is zero (the copies below write only [0, xlen)).
  for (int v = 0; v < nv; ++v)
    for (int i = xlen + int(threadIdx.x); i < p.x_elems; i += THREADS) xs[v * p.x_elems + i] = T(0.0f);
  __syncthreads();
  pdl_wait();

  if (warp == CW) {
    if (lane == 0) {
      const T* X = x_global();
      const uint32_t xb = tma::addr(&x_ready);
      if (!x_regs) {
        tma::expect(xb, uint32_t(nv) * xlen * sizeof(T));
        for (int v = 0; v < nv; ++v)
          for (int o = 0; o < xlen; o += 16384)  // pieces of 32 KiB
            tma::copy(tma::addr(xs + v * p.x_elems + o), X + v * a.x_vec + o,
                      uint32_t(min(16384, xlen - o) * sizeof(T)), xb);
      }
      const int c0 = int(k0 / 8);
      const int steps = ns(0);  // the most stages any warp of a tile takes
      const uint64_t policy = l2_evict_first();
      uint32_t ring0 = tma::addr(smem), full0 = tma::addr(&full[0][0]), empty0 = tma::addr(&empty[0][0]);
      // opaque: held in registers, not recomputed (S2UR of the CTA's shared window) for every box
      asm("" : "+r"(ring0), "+r"(full0), "+r"(empty0));
      int nsw[WT];  // stages per tile of warp w of a tile
#pragma unroll
      for (int w = 0; w < WT; ++w) nsw[w] = ns(w);
      // Lean: at SK = 256 one thread's issue rate bounds the whole SM (benchmarks/NOTES.md).
      for (int64_t n = 0; tile_of(n, 0) < tiles; ++n) {
        for (int j = 0; j < steps; ++j) {  // the j-th stage of every warp before the (j + 1)-th
          int slot[WT];  // ring slot of stage j of warp w of a tile, and its refill's wait
          uint32_t parity[WT];
#pragma unroll
          for (int w = 0; w < WT; ++w) {
            const int cnt = int(n) * nsw[w] + j;  // stages issued to the warp before this one
            slot[w] = cnt % S;
            parity[w] = cnt >= S ? ((cnt / S) - 1) & 1 : 2u;  // 2: the slot was never used
          }
#pragma unroll
          for (int w = 0; w < CW; ++w) {
            const int part = w % WT;
            const int64_t tile = tile_of(n, w / WT);
            const int k = part + WT * j;  // the stage of the row span
            if (tile < tiles && k < nst) {
              const int at = w * S + slot[part];
              if (parity[part] != 2u) tma::wait(empty0 + 8 * at, parity[part]);
              tma::expect(full0 + 8 * at, WSTAGE);
              tma::box_hint(ring0 + at * WSTAGE, &p.map, c0 + k * (SK / 8), int(tile * 16), int(g), full0 + 8 * at,
                            policy);
            }
          }
        }
      }
    }
    pdl_trigger();
    return;
  }

  const int tg = warp / WT;  // this warp's tile of the block's TG
  const int part = warp % WT;  // and its stages of the tile: part, part + WT, ...
  const int nsp = ns(part);
  const int gq = lane / 4;  // rows g and g + 8 of the tile; B column g
  const int t = lane % 4;   // the quad's chunk: bytes 16 t .. 16 t + 15 of each 64-byte step
  const ScaleKind sk(q.scale_dtype);
  const int s_shift = q.scale_dtype == int32_t(DType::kFloat32) ? 2 : 1;
  const char* S0 = static_cast<const char*>(q.scales) + ((g * q.s_group) << s_shift);
  const bool has_zeros = BITS == 4 && q.zeros != nullptr;
  const uint8_t* Z0 = has_zeros ? q.zeros + g * q.z_group : nullptr;
  const T* xv = xs + (gq < nv ? gq : 0) * p.x_elems;
  const uint32_t magic = Q::kMagic;
  auto clamp_row = [&](int64_t r) { return r < a.M ? r : a.M - 1; };

  // Group scales, and where they are applied (Mode, chosen per block below):
  //   kColumns (one vector): round rd of a flush of RW rounds writes only C column rd (the other
  //     lanes' B fragments read zeros instead of x), so after RW rounds column c of the tile holds
  //     the sum of round c alone; lane t scales its columns 2t, 2t + 1 by their rounds' scales
  //     (fp32, one FFMA per accumulator per flush) and the quad adds its columns at the end.
  //     With zero points (kColumnsZ, int4) the codes go into the mmas still offset
  //     (int4x8_offset: no half-pair arithmetic), and each column, before it is scaled, becomes
  //     kOffsetScale times its sum less (kOffsetBase + z) times its round's sum of x (fp32,
  //     summed once per block: by the warps of the tile groups that have no tile, while the
  //     others run their first stage, or where every group has one, by all consumer warps
  //     before it), z the round's zero point, loaded beside its scale. Where the block's x holds
  //     a NaN or an infinity, those sums would turn a weight's +-inf into NaN, and where it
  //     holds a value of Q::kBigExp or more the offset sums could overflow, so such blocks take
  //     kColumnsZx: exact integers q - z into the mmas, the rounds' own zero points biasing the
  //     dequantisation as in kRounds. (Symmetric int4 keeps q - 8 exact: the x sums ahead of
  //     the first stage cost it more than the arithmetic they save.)
  //   kRounds (several vectors, whose columns the tile needs): each round's own tile is scaled.
  // The mmas take exact integers (but kColumnsZ's). Zero points of kRounds and kColumnsZx, and
  // the kRounds scales, of a stage's (round rd, row h) are entry j = 2 rd + h, held by lane j % 4
  // of the quad as its entry j / 4 and shuffled when used; kColumns* scales and kColumnsZ zero
  // points are the lane's own (flush f, entry e: row g + 8 (e / 2), round f RW + 2t + e % 2). All
  // are loaded one stage ahead as raw bits (Raw: ok has bit i for entry i of s / zp, bit
  // 16 + 4 f + e for entry (f, e) of cs / cz, set where the entry is in use) and decoded into Meta
  // when their stage starts: decoded where they were loaded, the conversions made the warp wait
  // for the loads at once, every stage (benchmarks/NOTES.md). Entries not in use (past K, where W
  // and x are zero, or columns past RW) decode to scale 0 and zero point 8.
  enum Mode { kRowEnd, kRounds, kColumns, kColumnsZ, kColumnsZx };
  constexpr int MJ = ROUNDS / 2;
  constexpr int RW = ROUNDS < 8 ? ROUNDS : 8;  // rounds per kColumns flush: one per C column
  constexpr int FL = ROUNDS / RW;
  static_assert(MJ <= 16 && FL * 4 <= 16, "the ok bits of a stage's entries fit 32 bits");
  struct Raw {
    uint32_t s[MJ], zp[MJ], cs[FL][4], cz[FL][4], ok;
  };
  struct Meta {
    float s[MJ];
    uint32_t zp[MJ];
    float cs[FL][4];
    uint32_t cz[FL][4];
  };
  // 32-bit k (the launcher refuses K >= 2^31 - 64). Every load is in bounds (group 0 where an
  // entry is unused or past K), so the loads issue together, unbranched.
  auto fetch_meta = [&](auto mode, Raw& m, int64_t tile, int k) {
    constexpr Mode M = decltype(mode)::value;
    const int kst = int((k0 + int64_t(k) * SK) * VPB);  // the stage's first k
    int64_t rows[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) rows[h] = clamp_row(tile * 16 + gq + 8 * h);
    auto group_of = [&](int v, bool ok) { return int64_t(ok ? v >> q.group_shift : 0); };
    m.ok = 0u;
    if constexpr (M == kRounds || M == kColumnsZx) {  // entries j = t + 4 i: all of row g + 8 (t % 2)
      const int64_t r = t % 2 ? rows[1] : rows[0];
      const char* srow = S0 + ((r * q.lds) << s_shift);
      const uint8_t* zrow = has_zeros ? Z0 + r * q.ldz : nullptr;
#pragma unroll
      for (int i = 0; i < MJ; ++i) {
        const int v = kst + (t + 4 * i) / 2 * 64 * VPB;  // round (t + 4 i) / 2
        const bool ok = v < a.K;
        const int64_t grp = group_of(v, ok);
        if constexpr (M == kRounds) m.s[i] = scale_bits(srow + (grp << s_shift), sk);
        m.zp[i] = zero_point_bits(zrow + grp, has_zeros);
        m.ok |= ok ? 1u << i : 0u;
      }
    }
    if constexpr (M == kColumns || M == kColumnsZ || M == kColumnsZx) {
#pragma unroll
      for (int f = 0; f < FL; ++f)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = 2 * t + e % 2;
          const int v = kst + (f * RW + c) * 64 * VPB;
          const bool ok = c < RW && v < a.K;
          const int64_t grp = group_of(v, ok);
          m.cs[f][e] = scale_bits(S0 + ((rows[e / 2] * q.lds + grp) << s_shift), sk);
          if constexpr (M == kColumnsZ) m.cz[f][e] = zero_point_bits(Z0 + rows[e / 2] * q.ldz + grp, true);
          m.ok |= ok ? 1u << (16 + 4 * f + e) : 0u;
        }
    }
  };
  auto decode = [&](auto mode, const Raw& r, Meta& m) {
    constexpr Mode M = decltype(mode)::value;
    if constexpr (M == kRounds || M == kColumnsZx) {
#pragma unroll
      for (int i = 0; i < MJ; ++i) {
        const bool ok = (r.ok >> i) & 1u;
        if constexpr (M == kRounds) m.s[i] = ok ? scale_value(r.s[i], sk) : 0.0f;
        m.zp[i] = ok ? r.zp[i] & 15u : 8u;
      }
    }
    if constexpr (M == kColumns || M == kColumnsZ || M == kColumnsZx) {
#pragma unroll
      for (int f = 0; f < FL; ++f)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const bool ok = (r.ok >> (16 + 4 * f + e)) & 1u;
          m.cs[f][e] = ok ? scale_value(r.cs[f][e], sk) : 0.0f;
          if constexpr (M == kColumnsZ) m.cz[f][e] = ok ? r.cz[f][e] & 15u : 8u;
        }
    }
  };
  auto quad_entry = [&](auto v, int j) { return __shfl_sync(0xffffffffu, v, (lane & ~3) | (j % 4)); };
  // The biases of round rd's rows from the shuffled zero points.
  auto round_bias = [&](const Meta& m, int rd, uint32_t (&blo)[2], uint32_t (&bhi)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int e = 2 * rd + h;
      Q::int4_bias(quad_entry(m.zp[e / 4], e), blo[h], bhi[h]);
    }
  };
  // Four chains of dependent mmas per tile: mma h of word i of a chunk goes into chain(i, h).
  auto chain = [](int i, int h) { return BITS == 4 ? 2 * (i % 2) + h : i; };
  // The mmas of round rd of stage slot st into the chains c: this lane's chunk of rows g and
  // g + 8, dequantised with the biases blo / bhi, against x (this lane's pieces) at xr.
  // offset: int4's codes as int4x8_offset gives them (blo, bhi unused).
  auto round_mmas = [&](const uint8_t* st, const T* xr, int rd, const uint32_t (&blo)[2],
                        const uint32_t (&bhi)[2], float (&c)[4][4], auto offset) {
    const int kb = rd * 64 + t * 16;
    uint32_t xw[4 * XQ];
#pragma unroll
    for (int i = 0; i < XQ; ++i) {
      const uint4 x4 = *reinterpret_cast<const uint4*>(xr + 8 * i);
#pragma unroll
      for (int e = 0; e < 4; ++e) xw[4 * i + e] = word_of(x4, e);
    }
    uint32_t b[MMAS][2];
    if constexpr (BITS == 4) {
#pragma unroll
      for (int i = 0; i < MMAS; ++i) {
        b[i][0] = xw[2 * i];
        b[i][1] = xw[2 * i + 1];
      }
    } else {
      b_fragments<BITS>(xw, b);
    }
    const uint4 w0 = *reinterpret_cast<const uint4*>(st + gq * SK + kb);
    const uint4 w1 = *reinterpret_cast<const uint4*>(st + (gq + 8) * SK + kb);
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // word i of the chunk
      uint32_t lo[MMAS / 2], hi[MMAS / 2];
      if constexpr (decltype(offset)::value) {
        dequant_word_offset<MT, BITS>(word_of(w0, i), word_of(w1, i), magic, lo, hi);
      } else {
        dequant_word<MT, BITS>(word_of(w0, i), word_of(w1, i), magic, blo, bhi, lo, hi);
      }
      word_mmas<MT, BITS>(c[chain(i, 0)], c[chain(i, 1)], lo, hi, b, i);
    }
  };

  // int8, bfloat16 x: x as fp16 in shared memory, by the consumer warps (it ends on their
  // barrier). A block of one vector whose split is at most kXRegs pieces a consumer thread reads
  // it from global memory into registers, takes the largest exponent there and stores the fp16
  // values: one read of memory and no pass over shared memory before the conversion (0.05-0.8 us
  // less than the copy's path on an H200, benchmarks/NOTES.md). Any other block converts the
  // producer's copy in place, in two passes.
  // Vector v of the block is multiplied by 2^x_shift(v), which puts its largest magnitude in
  // [2^15, 2^16) (the shift is at most 126, for x that small): every finite value stays finite,
  // and a value is exact in fp16 unless it is 2^31 or more times smaller than the vector's
  // largest (its error is then below 2^-40 of that largest, far under the fp32 sums' own). NaN
  // and infinity stay what they are, and so do the rows' results (+-inf or NaN in every row,
  // whatever the finite values). fp32 holds each value times 2^shift exactly, and each output is
  // multiplied by 2^-shift (x_unscale), also exact. Group scales (kRounds, kColumns) multiply the
  // scaled sums (below 2^23 K): only a scale of 2^(105 - log2 K) or more could overflow fp32
  // there where the unscaled sums would not.
  auto x_shift = [&](int v) { return min(142 - int(x_exp[v]), 126); };
  auto x_to_fp16 = [&]() {
    auto exp_max = [](uint32_t m, uint4 u) {  // m and the exponent fields of u's pairs, per half
      constexpr uint32_t e = 0x7F807F80u;
      return __vmaxu2(m, __vmaxu2(__vmaxu2(u.x & e, u.y & e), __vmaxu2(u.z & e, u.w & e)));
    };
    auto publish = [&](int v, uint32_t m) {  // the warp's largest exponent field of vector v
      m = __reduce_max_sync(0xffffffffu, max(m & 0xFFFFu, m >> 16) >> 7);
      if (lane == 0) atomicMax(&x_exp[v], m);
    };
    auto as_fp16 = [](uint4 u, float f) {  // four pairs of bf16 as fp16, times f
      auto pair = [&](uint32_t w) {
        return bits_of(__floats2half2_rn(__uint_as_float(w << 16) * f, __uint_as_float(w & 0xFFFF0000u) * f));
      };
      return make_uint4(pair(u.x), pair(u.y), pair(u.z), pair(u.w));
    };
    auto factor = [&](int v) { return __uint_as_float(uint32_t(127 + x_shift(v)) << 23); };
    constexpr int STEP = CW * 32;  // the consumer threads
    uint4* const xp = reinterpret_cast<uint4*>(xs);
    if (x_regs) {  // one read of global memory, no pass over shared memory before the conversion
      const uint4* X = reinterpret_cast<const uint4*>(x_global());
      const int n = xlen / 8;
      uint4 u[kXRegs];
      uint32_t m = 0u;
#pragma unroll
      for (int j = 0; j < kXRegs; ++j) {
        const int i = int(threadIdx.x) + j * STEP;
        u[j] = i < n ? load_keep(X + i) : make_uint4(0u, 0u, 0u, 0u);
        m = exp_max(m, u[j]);
      }
      publish(0, m);
      asm volatile("bar.sync 1, %0;" ::"n"(STEP) : "memory");  // the consumer warps only
      const float f = factor(0);
#pragma unroll
      for (int j = 0; j < kXRegs; ++j) {
        const int i = int(threadIdx.x) + j * STEP;
        if (i < n) xp[i] = as_fp16(u[j], f);
      }
    } else {  // in place over the producer's copy
      const int pieces = p.x_elems / 8;  // 16-byte pieces of a vector (whole stages: whole warps' worth)
      for (int v = 0; v < nv; ++v) {
        uint32_t m = 0u;
        for (int i = threadIdx.x; i < pieces; i += STEP) m = exp_max(m, xp[v * pieces + i]);
        publish(v, m);
      }
      asm volatile("bar.sync 1, %0;" ::"n"(STEP) : "memory");
      for (int v = 0; v < nv; ++v) {
        const float f = factor(v);
        for (int i = threadIdx.x; i < pieces; i += STEP) xp[v * pieces + i] = as_fp16(xp[v * pieces + i], f);
      }
    }
    asm volatile("bar.sync 1, %0;" ::"n"(STEP) : "memory");
  };
  // What an output of vector v is multiplied by: 2^-x_shift(v) where x was converted, else 1.
  auto x_unscale = [&](int v) {
    return kConvertX ? __uint_as_float(uint32_t(127 - x_shift(v < NV ? v : 0)) << 23) : 1.0f;
  };

  // The consumer warps' work in mode `mode`; x_done: x has arrived and is in place already (a
  // kColumnsZ call that found a NaN, an infinity or a value too large in x, and returned false).
  auto consume = [&](auto mode, bool x_done) {
    constexpr Mode M = decltype(mode)::value;
    constexpr bool kGrouped = M != kRowEnd;
    constexpr bool kOffset = BITS == 4 && M == kColumnsZ;  // codes offset, x's round sums
    constexpr auto offset = std::bool_constant<kOffset>{};
    constexpr auto exact = std::false_type{};
    [[maybe_unused]] Raw cur{}, nxt{};  // this stage's metadata as loaded, and the next one's
    [[maybe_unused]] Meta cm;           // this stage's, decoded
    if constexpr (kGrouped)
      if (nsp > 0 && tile_of(0, tg) < tiles) fetch_meta(mode, cur, tile_of(0, tg), part);
    if (!x_done) {
      if (!x_regs) tma::wait(tma::addr(&x_ready), 0);
      if constexpr (kConvertX) x_to_fp16();
      if constexpr (kOffset) {
        // x into the k order of the B fragments as below; whether any value of x is too large
        // for the offset path (Q::kBigExp: its round sums, or the mmas' sums of the offset codes
        // times x, could overflow; a NaN or an infinity); and the round sums of x: each 16 lanes
        // of a warp sum a round, 16 pieces of 8 values, each lane adding its piece in fp32, then
        // across the 16 in a fixed order (the pieces of x, x_elems / 8, are whole warps' worth:
        // x_elems covers whole stages).
        auto piece_sum = [&](uint4 v) {  // a piece's 8 values in fp32, in a fixed order
          float sum = 0.0f;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const uint32_t w = word_of(v, e);
            sum += float(Q::pair(w).x) + float(Q::pair(w).y);
          }
          return sum;
        };
        auto round_sum = [&](int i, uint4 v) {
          float sum = piece_sum(v);
#pragma unroll
          for (int o = 1; o < 16; o *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
          if (lane % 16 == 0) xsum[i / 16] = sum;
        };
        uint32_t big = 0u;  // the largest exponent bits of x, per half
        auto order = [&](int i) {
          uint4* q8 = reinterpret_cast<uint4*>(xs) + i;
          const uint4 v = *q8;
          *q8 = int4_pair_order(v.x, v.y, v.z, v.w);
          constexpr uint32_t m = Q::kExpMask * 0x00010001u;
          big = __vmaxu2(big, __vmaxu2(__vmaxu2(v.x & m, v.y & m), __vmaxu2(v.z & m, v.w & m)));
          return v;
        };
        if (spare == 0) {  // the sums in the same pass. Unrolled: the pieces' shuffle chains overlap
#pragma unroll 4
          for (int i = threadIdx.x; i < p.x_elems / 8; i += CW * 32) round_sum(i, order(i));
        } else {
          for (int i = threadIdx.x; i < p.x_elems / 8; i += CW * 32) order(i);
        }
        const uint32_t bad = (big & 0xFFFFu) >= Q::kBigExp || (big >> 16) >= Q::kBigExp ? 1u : 0u;
        uint32_t any;  // the consumer warps only, or-reducing `bad` on the way
        asm volatile("{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, 1, %2, p;\n"
                     " selp.u32 %0, 1, 0, q;\n}"
                     : "=r"(any)
                     : "r"(bad), "n"(CW * 32)
                     : "memory");
        if (any) return false;
        if (spare > 0 && tg >= TG - spare) {
          // A warp of a spare group (no tile): the round sums, then each thread arrives on
          // sums_ready, which the warps with tiles wait on before their first use of a sum, so
          // they run their first stage meanwhile.
          // Four lanes a round, four pieces each: eight rounds a warp at a time, two shuffles.
          const int rounds = p.x_elems / 128;
#pragma unroll 2
          for (int r0 = (warp - (TG - spare) * WT) * 8; r0 < rounds; r0 += spare * WT * 8) {
            const int r = r0 + lane / 4;
            const uint4* piece = reinterpret_cast<const uint4*>(xs) + (r < rounds ? r : 0) * 16 + (lane % 4) * 4;
            float part[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) part[j] = piece_sum(piece[j]);
            float sum = (part[0] + part[1]) + (part[2] + part[3]);
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            if (lane % 4 == 0 && r < rounds) xsum[r] = sum;
          }
          tma::arrive(tma::addr(&sums_ready));
          return true;
        }
      } else if constexpr (BITS == 4) {
        // int4: x in shared memory goes into the k order of the B fragments once (each 8 values
        // k = 0..7 as (0, 4), (1, 5), (2, 6), (3, 7)), so the rounds load the fragments directly.
        for (int i = threadIdx.x; i < nv * p.x_elems / 8; i += CW * 32) {
          uint4* q8 = reinterpret_cast<uint4*>(xs) + i;
          const uint4 v = *q8;
          *q8 = int4_pair_order(v.x, v.y, v.z, v.w);
        }
        asm volatile("bar.sync 1, %0;" ::"n"(CW * 32) : "memory");  // the consumer warps only
      }
    }
    int cnt = 0;
    for (int64_t n = 0;; ++n) {
      const int64_t tile = tile_of(n, tg);
      if (tile >= tiles) break;
      int64_t row[2];
      uint32_t row_blo[2], row_bhi[2];  // the biases of the rows' zero points (8 where none)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        row[h] = tile * 16 + gq + 8 * h;
        const bool per_row = M == kRowEnd && has_zeros;
        Q::int4_bias(zero_point(Z0 + clamp_row(row[h]) * q.ldz, per_row), row_blo[h], row_bhi[h]);
      }
      float acc[4][4] = {};  // kRowEnd: four chains; grouped modes: acc[0], scaled
      for (int j = 0; j < nsp; ++j, ++cnt) {
        const int k = part + WT * j;  // the stage of the row span
        const int s = cnt % S;
        if constexpr (kGrouped) {  // this stage's metadata decoded; the next stage's loaded
          decode(mode, cur, cm);
          const bool more = j + 1 < nsp;
          const int64_t nt = more ? tile : tile_of(n + 1, tg);
          if (nt < tiles) fetch_meta(mode, nxt, nt, more ? k + WT : part);
        }
        tma::wait(tma::addr(&full[warp][s]), (cnt / S) & 1);
        const uint8_t* st = smem + (warp * S + s) * WSTAGE;
        const T* xst = xv + (k * SK + t * 16) * VPB;  // this lane's x of the stage's round 0
        if constexpr (M == kRowEnd) {
#pragma unroll
          for (int rd = 0; rd < ROUNDS; ++rd) round_mmas(st, xst + rd * 64 * VPB, rd, row_blo, row_bhi, acc, exact);
        } else if constexpr (M == kRounds) {
#pragma unroll
          for (int rd = 0; rd < ROUNDS; ++rd) {
            uint32_t blo[2], bhi[2];
            round_bias(cm, rd, blo, bhi);
            float rs[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) rs[h] = quad_entry(cm.s[(2 * rd + h) / 4], 2 * rd + h);
            float tl[4][4] = {};
            round_mmas(st, xst + rd * 64 * VPB, rd, blo, bhi, tl, exact);
#pragma unroll
            for (int e = 0; e < 4; ++e)
              acc[0][e] = fmaf(rs[e / 2], (tl[0][e] + tl[1][e]) + (tl[2][e] + tl[3][e]), acc[0][e]);
          }
        } else {
#pragma unroll
          for (int f = 0; f < FL; ++f) {
            float tl[4][4] = {};
#pragma unroll
            for (int r = 0; r < RW; ++r) {
              const int rd = f * RW + r;
              uint32_t blo[2] = {row_blo[0], row_blo[1]}, bhi[2] = {row_bhi[0], row_bhi[1]};
              if constexpr (M == kColumnsZx) round_bias(cm, rd, blo, bhi);
              round_mmas(st, gq == r ? xst + rd * 64 * VPB : zx, rd, blo, bhi, tl, offset);
            }
            float cols[4];  // the columns' sums of (q - z) x (kOffset: of the offset codes times x)
#pragma unroll
            for (int e = 0; e < 4; ++e) cols[e] = (tl[0][e] + tl[1][e]) + (tl[2][e] + tl[3][e]);
            if constexpr (kOffset) {  // less (kOffsetBase + z) times the columns' round sums of x
              // The stage is read: released before the first sums are waited for.
              if (f == FL - 1) tma::release(tma::addr(&empty[warp][s]));
              if (spare > 0 && cnt == 0 && f == 0) tma::wait(tma::addr(&sums_ready), 0);
              const int r0 = k * ROUNDS + f * RW + (2 * t < RW ? 2 * t : 0);  // even: 8-byte aligned
              const float2 xr = *reinterpret_cast<const float2*>(xsum + r0);
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const float zo = Q::kOffsetBase + float(int(cm.cz[f][e]));
                cols[e] = fmaf(cols[e], Q::kOffsetScale, -zo * (e % 2 ? xr.y : xr.x));
              }
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[0][e] = fmaf(cm.cs[f][e], cols[e], acc[0][e]);
          }
        }
        if constexpr (!kOffset) tma::release(tma::addr(&empty[warp][s]));
        if constexpr (kGrouped) cur = nxt;
      }
      // C tile: [0..1] row g, columns 2t and 2t + 1; [2..3] the same for row g + 8.
      float c[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) c[e] = kGrouped ? acc[0][e] : (acc[0][e] + acc[1][e]) + (acc[2][e] + acc[3][e]);
      if constexpr (WT > 1) {  // warps 1..WT-1 hand their tiles to warp 0, in a fixed order
        float4* slot = red + ((int(n & 1) * TG + tg) * (WT - 1)) * 32 + lane;
        if (part > 0) slot[(part - 1) * 32] = make_float4(c[0], c[1], c[2], c[3]);
        asm volatile("bar.sync %0, %1;" ::"r"(2 + tg), "n"(WT * 32) : "memory");
        if (part > 0) continue;
#pragma unroll
        for (int w = 1; w < WT; ++w) {
          const float4 o = slot[(w - 1) * 32];
          c[0] += o.x;
          c[1] += o.y;
          c[2] += o.z;
          c[3] += o.w;
        }
      }
      if constexpr (M == kColumns || M == kColumnsZ || M == kColumnsZx) {  // the rows' sums over the quad's columns
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float r = c[2 * h] + c[2 * h + 1];
          r += __shfl_xor_sync(0xffffffffu, r, 1);
          c[2 * h] = r + __shfl_xor_sync(0xffffffffu, r, 2);
        }
      }
      // kRowEnd: the rows' scales, loaded only now: loaded before the stages (when every SM's
      // first TMA requests are queued) they cost 0.75 us at 8192 x 8192 on an H200
      // (benchmarks/NOTES.md).
      float scale[2] = {1.0f, 1.0f};
      if constexpr (M == kRowEnd) {
#pragma unroll
        for (int h = 0; h < 2; ++h) scale[h] = scale_at(S0 + ((clamp_row(row[h]) * q.lds) << s_shift), sk);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t m = row[e / 2];
        const int v = 2 * t + (e % 2);
        if (m < a.M && v < nv) store_output<T>(a, split, g, v0 + v, m, c[e] * x_unscale(v) * scale[e / 2]);
      }
    }
    return true;
  };
  if constexpr (SC == Scaling::kRow) {
    consume(std::integral_constant<Mode, kRowEnd>{}, false);
  } else if (nv > 1) {
    consume(std::integral_constant<Mode, kRounds>{}, false);
  } else if (has_zeros) {
    if (!consume(std::integral_constant<Mode, kColumnsZ>{}, false))  // false: x not finite
      consume(std::integral_constant<Mode, kColumnsZx>{}, true);
  } else {
    consume(std::integral_constant<Mode, kColumns>{}, false);
  }
  pdl_trigger();
#endif
}

}  // namespace kernels
}  // namespace gemvx
