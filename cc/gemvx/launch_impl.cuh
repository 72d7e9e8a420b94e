// The launcher's machinery, shared by launch.cu and the launch_part translation units: device
// facts, the config families (how a config maps onto a kernel and a grid), and run / paths_for /
// splits_for of one family. The per-config instantiations (the kernels) are compiled in
// kLaunchParts translation units (launch_part.cu.in, one per part, in parallel); launch.cu
// dispatches to them by config id.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "configs.h"
#include "kernels/finish.cuh"
#include "kernels/gemv_mma.cuh"
#include "kernels/gemv_mma_t.cuh"
#include "kernels/gemv_quant.cuh"
#include "kernels/gemv_quant_tma.cuh"
#include "kernels/gemv_rowmajor.cuh"
#include "kernels/gemv_tile.cuh"
#include "kernels/gemv_tile_t.cuh"
#include "kernels/gemv_tma.cuh"
#include "kernels/gemv_transposed.cuh"
#include "launch.h"

namespace gemvx {
namespace detail {

using kernels::Args;

constexpr int64_t kMaxGridZ = 65535;

// ----- config families: how a config maps onto a kernel and a grid ---------------------------

// Per device: its ordinal (-1 when unknown), compute capability 9.0 or newer, the SM count and
// the most dynamic shared memory a block may have (0 when unknown).
struct DeviceInfo {
  int id = -1;
  bool hopper = false;
  int sms = 0, smem_optin = 0;
};
inline const DeviceInfo& device_info() {
  static DeviceInfo info[64];
  static std::atomic<int8_t> known[64] = {};
  static const DeviceInfo none{};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return none;
  if (known[dev].load(std::memory_order_acquire) == 0) {
    DeviceInfo d;
    d.id = dev;
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess)
      d.hopper = major >= 9;
    info[dev] = d;  // every thread writes the same values
    known[dev].store(1, std::memory_order_release);
  }
  return info[dev];
}

// GPUs that can overlap a launch with the previous kernel's tail (programmatic dependent launch,
// compute capability 9.0+; the kernels' pdl_begin() keeps memory ordered). GEMVX_PDL=0 in the
// environment turns it off (for comparison).
inline bool pdl_enabled() {
  static const bool allowed = [] {
    const char* e = std::getenv("GEMVX_PDL");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return allowed && device_info().hopper;
}

// Every kernel goes through here. The launch error is read by the caller (cudaGetLastError).
// overlap = false launches without programmatic dependent launch even where it is on.
template <typename A, typename... P>
void launch_kernel(void (*kernel)(P...), dim3 grid, int threads, cudaStream_t s, const A& a,
                   std::size_t smem = 0, bool overlap = true) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(unsigned(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = overlap && pdl_enabled() ? 1 : 0;
  cudaLaunchKernelEx(&cfg, kernel, a);
}

// The lean argument block (kernels/common.cuh, LeanArgs) of a row-major launch that is one plain
// GEMV: one vector, one matrix, no split, K a whole number of 16-byte chunks, K and ldw below
// 2^31, M below 2^31 - 2^16 (so the rows of its last block, past M, still fit 32 bits).
inline bool lean_args(const Args& a, int vw, kernels::LeanArgs* l) {
  constexpr int64_t kMax = 0x7fffffff;
  if (a.splits != 1 || a.nvec != 1 || a.groups != 1 || a.K % vw != 0 || a.M > kMax - 65536 ||
      a.K > kMax || a.ldw > kMax)
    return false;
  *l = {a.W, a.x, a.y, int32_t(a.M), int32_t(a.K), int32_t(a.ldw), a.alpha, a.beta, a.y_in};
  return true;
}

// Blocks of `Kernel` (with `threads` threads and `smem` bytes of dynamic shared memory, the same
// at every call) resident per SM on the current device, asked once a device; 0 where the query
// fails or no device is known.
template <auto Kernel>
int blocks_per_sm(int threads, int smem) {
  const DeviceInfo& d = device_info();
  if (d.id < 0) return 0;
  static std::atomic<int32_t> known[64] = {};  // blocks per SM + 1; 0: not asked yet
  int32_t n = known[d.id].load(std::memory_order_relaxed);
  if (n == 0) {
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, Kernel, threads, smem) != cudaSuccess) {
      cudaGetLastError();
      blocks = 0;
    }
    n = blocks + 1;
    known[d.id].store(n, std::memory_order_relaxed);
  }
  return n - 1;
}

// Args::prefetch_blocks for a launch of the row-major kernel `Kernel` by a Prefetch config
// (kernels/common.cuh: the blocks resident from the start ask L2 for their first rows of W before
// they wait on the previous kernel): as many blocks as fit on the GPU at once, where programmatic
// dependent launch is on; else 0. The blocks of later waves start after the previous kernel has
// ended, so the prologue would only cost them time (H200, fp16 128256x4096, config 16 with every
// block prefetching: 231 -> 247 us; benchmarks/NOTES.md).
template <auto Kernel>
int32_t prefetch_blocks(dim3 grid, int threads) {
  if (!pdl_enabled()) return 0;
  const DeviceInfo& d = device_info();
  if (d.id < 0 || d.sms <= 0) return 0;
  const int64_t total = int64_t(grid.x) * grid.y * grid.z;
  return int32_t(std::min<int64_t>(total, int64_t(blocks_per_sm<Kernel>(threads, 0)) * d.sms));
}

// Whether `kernel` can run with `bytes` of dynamic shared memory on the current device. More than
// 48 KiB must be allowed once per kernel and device; `state` (one entry per device, owned by the
// caller for its kernel) remembers 1 = allowed, -1 = more than the device offers (the caller then
// runs its CUDA-core kernel instead). A failure to allow is not remembered: the launch then fails
// and reports it.
template <typename K>
bool smem_ok(K kernel, int bytes, std::atomic<int8_t> (&state)[64]) {
  const DeviceInfo& d = device_info();
  if (d.id < 0) return true;
  const int8_t known = state[d.id].load(std::memory_order_relaxed);
  if (known != 0) return known > 0;
  if (d.smem_optin > 0 && d.smem_optin < bytes) {
    state[d.id].store(-1, std::memory_order_relaxed);
    return false;
  }
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) ==
      cudaSuccess)
    state[d.id].store(1, std::memory_order_relaxed);
  return true;
}

// KIND: 0 = CUDA cores, 1 = CUDA cores with software-pipelined loads, 2 = tensor cores (gemv_mma:
// fp16 / bf16, and fp32 as 3xTF32) on the 16-byte body, 3 = the same with software-pipelined loads,
// 4 and 5 = 0 and 1 with the L2 prefetch before the wait (Args::prefetch_blocks), 6 and 7 = 0 and 1
// with LeanArgs for a plain GEMV (lean_args; other calls run 0 and 1 as they are); the scalar
// variant of a tensor-core config runs the CUDA-core kernel with the same rows, lanes and splits
// (one 16-byte load per row in flight).
template <int KIND, int THREADS, int TPR, int R, int U, int NV>
struct RowMajorFamily {
  static constexpr bool kMma = KIND == 2 || KIND == 3;
  static_assert(!kMma || (TPR % 4 == 0 && THREADS % (8 * TPR) == 0 && NV == 16),
                "tensor-core configs: P1 = 4 x warps along K, whole warps along M, 16 vectors");
  static constexpr bool kTrans = false;
  static constexpr bool kPipelined = KIND == 1 || KIND == 3 || KIND == 5 || KIND == 7;
  static constexpr bool kPrefetch = KIND == 4 || KIND == 5;
  static constexpr bool kLean = KIND >= 6;
  static_assert(!kPrefetch || NV == 1, "Prefetch configs: one vector (the kernel's prologue is for NV = 1)");
  static_assert(!kLean || NV == 1, "Lean configs: one vector");
  static constexpr bool kTensorCores = kMma;
  static constexpr int kThreads = THREADS, kNV = NV;
  // K is cut into 16-byte chunks (elements in the scalar variant).
  static int64_t k_units(const Problem& p, int vw) { return p.K / vw; }
  static int64_t min_units_per_split() { return int64_t(TPR) * U; }
  static int64_t round_span(int64_t s) { return (s + TPR - 1) / TPR * TPR; }
  static int64_t grid_x(const Problem& p, int) { return (p.M + THREADS / TPR * R - 1) / (THREADS / TPR * R); }
  // The CUDA-core kernel of the family (the scalar variant of tensor-core configs too).
  template <typename T, bool VEC>
  static constexpr auto kCudaCores = kernels::gemv_rowmajor<T, THREADS, TPR, R, kMma ? 1 : U, NV, kPipelined && !kMma, VEC>;
  // Args::prefetch_blocks of a launch (Prefetch configs only).
  template <typename T, bool VEC>
  static int32_t prefetching(dim3 grid) {
    if constexpr (kPrefetch)
      return prefetch_blocks<kCudaCores<T, VEC>>(grid, THREADS);
    else
      return 0;
  }
  template <typename T, bool VEC>
  static void launch(dim3 grid, cudaStream_t s, const Args& a) {
    if constexpr (kMma && VEC) {
      launch_kernel(kernels::gemv_mma<T, THREADS, TPR, R, U, KIND == 3>, grid, THREADS, s, a);
    } else {
      Args b = a;
      b.prefetch_blocks = prefetching<T, VEC>(grid);
      if constexpr (kLean && VEC) {
        kernels::LeanArgs l;
        if (lean_args(b, int(16 / sizeof(T)), &l)) {
          launch_kernel(kernels::gemv_rowmajor<T, THREADS, TPR, R, U, 1, kPipelined, true, kernels::LeanArgs>,
                        grid, THREADS, s, l);
          return;
        }
      }
      launch_kernel(kCudaCores<T, VEC>, grid, THREADS, s, b);
    }
  }
};
template <int THREADS, int TPR, int R, int U, int NV>
using RowMajor = RowMajorFamily<0, THREADS, TPR, R, U, NV>;
template <int THREADS, int TPR, int R, int U, int NV>
using RowMajorPipelined = RowMajorFamily<1, THREADS, TPR, R, U, NV>;
template <int THREADS, int TPR, int R, int U, int NV>
using RowMajorMma = RowMajorFamily<2, THREADS, TPR, R, U, NV>;
template <int THREADS, int TPR, int R, int U, int NV>
using RowMajorMmaPipelined = RowMajorFamily<3, THREADS, TPR, R, U, NV>;
template <int THREADS, int TPR, int R, int U, int NV>
using RowMajorPrefetch = RowMajorFamily<4, THREADS, TPR, R, U, NV>;
template <int THREADS, int TPR, int R, int U, int NV>
using RowMajorPipelinedPrefetch = RowMajorFamily<5, THREADS, TPR, R, U, NV>;
template <int THREADS, int TPR, int R, int U, int NV>
using RowMajorLean = RowMajorFamily<6, THREADS, TPR, R, U, NV>;
template <int THREADS, int TPR, int R, int U, int NV>
using RowMajorPipelinedLean = RowMajorFamily<7, THREADS, TPR, R, U, NV>;

// MMA = false: CUDA cores, P2 = 1. MMA = true: tensor cores (gemv_mma_t; fp32 as 3xTF32) on the
// 16-byte body, P2 = 32-column tiles per warp. PIPE: software-pipelined W loads (CUDA cores: one
// vector, or a multiple of four with x staged in shared memory). The scalar variant of a
// tensor-core config (and fp32 where its tiles do not fit, see kMmaFits) runs the CUDA-core kernel
// (unpipelined) with the same threads, columns per block and splits (so the grid is the same
// either way).
template <bool MMA, bool PIPE, int THREADS, int CB, int P2, int U, int NV>
struct TransposedFamily {
  static_assert(MMA || (P2 == 1 && (!PIPE || NV == 1 || NV % 4 == 0)),
                "Transposed configs take P2 = 1; the pipelined ones one vector or 4n");
  static_assert(!MMA || (NV == 16 && CB % (4 * P2) == 0 && (THREADS / 32) % (CB / (4 * P2)) == 0),
                "tensor-core configs: P1 = 4 x P2 x warps along M, whole warps along K, 16 vectors");
  static constexpr bool kTrans = true;
  static constexpr bool kPipelined = PIPE;
  static constexpr bool kTensorCores = MMA;
  static constexpr int kThreads = THREADS, kNV = NV;
  // K is cut into rows of W; a split holds whole steps of every K slice (CUDA cores: THREADS / CB
  // threads; tensor cores: 16-row groups of each warp along K, or for fp32 8-row groups of twice
  // as many warps: the same rows).
  static constexpr int kStep = MMA ? 16 * (THREADS / 32) / (CB / (4 * P2)) : THREADS / CB;
  // Whether the tensor-core kernel takes T: fp32 warp tiles are 8 chunks wide (twice the 16-bit
  // ones) and 8 rows deep (half), so a block has the same rows per step if its chunks divide.
  template <typename T>
  static constexpr bool kMmaFits =
      sizeof(T) == 2 || (CB % (8 * P2) == 0 && (THREADS / 32) % (CB / (8 * P2)) == 0);
  static int64_t k_units(const Problem& p, int) { return p.K; }
  static int64_t min_units_per_split() { return int64_t(kStep) * U; }
  static int64_t round_span(int64_t s) { return (s + kStep - 1) / kStep * kStep; }
  static int64_t grid_x(const Problem& p, int vw) {
    const int64_t chunks = (p.M + vw - 1) / vw;
    return (chunks + CB - 1) / CB;
  }
  template <typename T, bool VEC>
  static void launch(dim3 grid, cudaStream_t s, const Args& a) {
    if constexpr (MMA && VEC && kMmaFits<T>)
      launch_kernel(kernels::gemv_mma_t<T, THREADS, CB, P2, U, PIPE>, grid, THREADS, s, a);
    else
      launch_kernel(kernels::gemv_transposed<T, THREADS, CB, U, NV, PIPE && !MMA, VEC>, grid, THREADS, s, a);
  }
};
template <int THREADS, int CB, int P2, int U, int NV>
using Transposed = TransposedFamily<false, false, THREADS, CB, P2, U, NV>;
template <int THREADS, int CB, int P2, int U, int NV>
using TransposedPipelined = TransposedFamily<false, true, THREADS, CB, P2, U, NV>;
template <int THREADS, int CB, int P2, int U, int NV>
using TransposedMma = TransposedFamily<true, false, THREADS, CB, P2, U, NV>;
template <int THREADS, int CB, int P2, int U, int NV>
using TransposedMmaPipelined = TransposedFamily<true, true, THREADS, CB, P2, U, NV>;

// Layout N, 16 vectors on tensor cores through shared memory (kernels/gemv_tile.cuh): P1 = BM rows
// per block, P2 = BKC 16-byte chunks of K per stage, U = STAGES (fp32 as 3xTF32). The scalar variant
// and GPUs with less shared memory per block than the config needs run the CUDA-core kernel with
// the same rows per block (4 lanes per row) and splits.
template <int THREADS, int BM, int BKC, int STAGES, int NV>
struct RowMajorTile {
  static_assert(NV == 16 && (4 * BM) % THREADS == 0, "tile configs: 16 vectors, 4 lanes per row");
  static constexpr bool kTrans = false;
  static constexpr bool kPipelined = true;
  static constexpr bool kTensorCores = true;
  static constexpr int kThreads = THREADS, kNV = NV;
  static constexpr int kSmem = kernels::tile_smem_bytes<BM, BKC, STAGES>();
  static int64_t k_units(const Problem& p, int vw) { return p.K / vw; }
  static int64_t min_units_per_split() { return BKC; }
  static int64_t round_span(int64_t s) { return (s + BKC - 1) / BKC * BKC; }
  static int64_t grid_x(const Problem& p, int) { return (p.M + BM - 1) / BM; }
  template <typename T, bool VEC>
  static void launch(dim3 grid, cudaStream_t s, const Args& a) {
    if constexpr (VEC) {
      static std::atomic<int8_t> state[64] = {};
      if (smem_ok(kernels::gemv_tile<T, THREADS, BM, BKC, STAGES>, kSmem, state)) {
        launch_kernel(kernels::gemv_tile<T, THREADS, BM, BKC, STAGES>, grid, THREADS, s, a,
                      kSmem);
        return;
      }
    }
    launch_kernel(kernels::gemv_rowmajor<T, THREADS, 4, 4 * BM / THREADS, 1, NV, false, VEC>, grid,
                  THREADS, s, a);
  }
};

// Layout T, 16 vectors on tensor cores through shared memory (kernels/gemv_tile_t.cuh): P1 = BMC
// 16-byte column chunks per block, P2 = BKC: 8 BKC rows of W per stage, U = STAGES (fp32 as
// 3xTF32). The scalar variant, x rows that are not 16-byte aligned and GPUs with too little shared
// memory per block run the CUDA-core kernel with the same columns per block and splits.
template <int THREADS, int BMC, int BKC, int STAGES, int NV>
struct TransposedTile {
  static constexpr int64_t kOverlapMaxBytes = int64_t(16) << 20;  // between 8 and 32 MiB measured
  static_assert(NV == 16, "tile configs: 16 vectors");
  static constexpr bool kTrans = true;
  static constexpr bool kPipelined = true;
  static constexpr bool kTensorCores = true;
  static constexpr int kThreads = THREADS, kNV = NV;
  template <typename T>
  static constexpr int kSmem = kernels::tile_t_smem_bytes<T, BMC, BKC, STAGES>();
  static int64_t k_units(const Problem& p, int) { return p.K; }
  static int64_t min_units_per_split() { return 8 * BKC; }
  static int64_t round_span(int64_t s) { return (s + 8 * BKC - 1) / (8 * BKC) * (8 * BKC); }
  static int64_t grid_x(const Problem& p, int vw) { return ((p.M + vw - 1) / vw + BMC - 1) / BMC; }
  template <typename T, bool VEC>
  static void launch(dim3 grid, cudaStream_t s, const Args& a) {
    if constexpr (VEC) {
      constexpr int64_t vw = 16 / sizeof(T);
      const bool x_ok = (reinterpret_cast<uintptr_t>(a.x) & 15) == 0 &&
                        (a.nvec <= 1 || a.x_vec % vw == 0) && (a.groups <= 1 || a.x_group % vw == 0);
      static std::atomic<int8_t> state[64] = {};
      if (x_ok && smem_ok(kernels::gemv_tile_t<T, THREADS, BMC, BKC, STAGES>, kSmem<T>, state)) {
        // Overlap with the previous kernel only while W is small: on large W back-to-back
        // batch-16 calls of config 76 ran bimodally with it (fp16 8192x8192 on an H200: 51.4 us
        // median, 39.3 us without; the likely cause is early blocks landing two to an SM), while
        // on small W it hides 0.4-0.8 us of launch latency (benchmarks/NOTES.md).
        const bool overlap = a.M * a.K * a.groups * int64_t(sizeof(T)) < kOverlapMaxBytes;
        launch_kernel(kernels::gemv_tile_t<T, THREADS, BMC, BKC, STAGES>, grid, THREADS, s, a,
                      kSmem<T>, overlap);
        return;
      }
    }
    launch_kernel(kernels::gemv_transposed<T, THREADS, BMC, 1, NV, false, VEC>, grid, THREADS, s, a);
  }
};

// The tensor-map encoder of the driver (cuTensorMapEncodeTiled), found once through the runtime
// so the library does not link the driver; null where the driver has none.
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
inline EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      f = nullptr;
    cudaGetLastError();
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

// 16 vectors on tensor cores, W and x streamed by the TMA (kernels/gemv_tma.cuh): THREADS - 32
// consumer threads and a producer warp, U = S stages. Runs on Hopper with operands the TMA takes
// (plan); otherwise the CUDA-core kernel runs with THREADS - 32 threads, the same outputs per block
// and the same splits.
//   TRANS (TransposedTma): P1 = BMC 16-byte column chunks per block (whole boxes of 128-byte rows:
//     64 columns of a 16-bit type, 32 of fp32), P2 = 8 (64 rows of W per stage).
//   Layout N (RowMajorTma): P1 = BM rows per block (at most 256: one box), P2 = BKC 16-byte chunks
//     of K per stage (whole 128-byte boxes); K counted in chunks, as RowMajorTile does.
// LOOP (the ...Loop families): the TMA kernel's grid is as many blocks as fit at once over the
// (split, group, vector-chunk) slices, each block taking every gridDim.x-th tile of outputs.
template <bool TRANS, int THREADS, int P1, int P2, int S, int NV, bool LOOP>
struct TmaFamily {
  static_assert(NV == 16 && (TRANS ? 8 * P2 == kernels::kTmaTRows : P2 % 8 == 0 && P1 <= 256),
                "TMA configs: 16 vectors, 64 rows (layout T) or whole boxes of at most 256 rows (N) per stage");
  static_assert(TRANS || (4 * P1) % (THREADS - 32) == 0, "layout N TMA configs: the fallback's 4 lanes per row");
  static constexpr bool kTrans = TRANS;
  static constexpr bool kPipelined = true;
  static constexpr bool kTensorCores = true;
  static constexpr int kThreads = THREADS, kNV = NV;
  static constexpr int kKStep = TRANS ? 8 * P2 : P2;  // k units (rows; N: chunks) per stage
  template <typename T>
  static constexpr int kSmem = TRANS ? kernels::tma_t_smem_bytes<T, P1, S>() : kernels::tma_n_smem_bytes<P1, P2, S>();
  static int64_t k_units(const Problem& p, int vw) { return TRANS ? p.K : p.K / vw; }
  static int64_t min_units_per_split() { return kKStep; }
  static int64_t round_span(int64_t s) { return (s + kKStep - 1) / kKStep * kKStep; }
  static int64_t grid_x(const Problem& p, int vw) {
    return TRANS ? ((p.M + vw - 1) / vw + P1 - 1) / P1 : (p.M + P1 - 1) / P1;
  }
  template <typename T>
  static constexpr auto kKernel = [] {
    if constexpr (TRANS)
      return kernels::gemv_tma_t<T, THREADS, P1, S, LOOP>;
    else
      return kernels::gemv_tma_n<T, THREADS, P1, P2, S, LOOP>;
  }();

  // LOOP: the grid's x for a launch of `grid`: the output tiles, at most the blocks that fit on the
  // GPU at once over its (split, group, vector-chunk) slices (blocks per SM queried once a device).
  template <typename T>
  static unsigned loop_grid_x(dim3 grid) {
    const DeviceInfo& dev = device_info();
    const int per_sm = blocks_per_sm<kKernel<T>>(THREADS, kSmem<T>);
    if (per_sm <= 0 || dev.sms <= 0) return grid.x;  // no answer: one tile a block
    const int64_t slices = int64_t(grid.y) * grid.z;
    const int64_t resident = (int64_t(dev.sms) * per_sm + slices - 1) / slices;
    return unsigned(std::max<int64_t>(1, std::min<int64_t>(grid.x, resident)));
  }

  // The TMA kernel's argument for a launch of the 16-byte body (the tensor maps of W and x), or
  // false where it cannot take it: not Hopper, operands or strides not on 16 bytes, or too little
  // shared memory.
  template <typename T>
  static bool plan(const Args& a, kernels::TmaTArgs* t) {
    const EncodeTiled encode = encode_tiled();
    auto a16 = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; };
    if (!device_info().hopper || encode == nullptr || !a16(a.W) || !a16(a.x)) return false;
    // Byte strides; a dimension of one entry takes any multiple of 16. W's rows: K of them in
    // layout T (M values each), M in layout N (K values each).
    constexpr int64_t sz = sizeof(T);
    const int64_t w_rows = TRANS ? a.K : a.M, w_row = TRANS ? a.M : a.K;
    const int64_t ldw = w_rows > 1 ? sz * a.ldw : (sz * w_row + 15) / 16 * 16;
    const int64_t w_group = a.groups > 1 ? sz * a.w_group : ldw * w_rows;
    const int64_t x_vec = a.nvec > 1 ? sz * a.x_vec : (sz * a.K + 15) / 16 * 16;
    const int64_t x_group = a.groups > 1 ? sz * a.x_group : x_vec * a.nvec;
    if (ldw % 16 != 0 || w_group % 16 != 0 || x_vec % 16 != 0 || x_group % 16 != 0) return false;
    static std::atomic<int8_t> state[64] = {};
    if (!smem_ok(kKernel<T>, kSmem<T>, state)) return false;
    *t = kernels::TmaTArgs{};
    t->a = a;
    const cuuint32_t step[3] = {1, 1, 1};
    auto map = [&](CUtensorMap* m, const void* base, cuuint64_t d0, cuuint64_t d1, cuuint64_t d2,
                   int64_t s1, int64_t s2, cuuint32_t b0, cuuint32_t b1, CUtensorMapL2promotion pr) {
      const cuuint64_t dims[3] = {d0, d1, d2};
      const cuuint64_t strides[2] = {cuuint64_t(s1), cuuint64_t(s2)};
      const cuuint32_t box[3] = {b0, b1, 1};
      return encode(m, sz == 4 ? CU_TENSOR_MAP_DATA_TYPE_UINT32 : CU_TENSOR_MAP_DATA_TYPE_UINT16, 3,
                    const_cast<void*>(base), dims, strides, box, step,
                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                    pr, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
    };
    // W in 128-byte L2 promotions (read with evict_first, 256 ran up to 6% slower across a rotation of
    // 4x L2, which the policy partly kept in L2; not measured again past 32x; benchmarks/NOTES.md).
    // Boxes of W: E columns x 64 rows (T), E values of k x BM rows (N).
    constexpr cuuint32_t e = kernels::tma_t_box_values<T>();
    const bool w_ok = TRANS ? map(&t->wmap, a.W, cuuint64_t(a.M), cuuint64_t(a.K), cuuint64_t(a.groups), ldw,
                                  w_group, e, kernels::kTmaTRows, CU_TENSOR_MAP_L2_PROMOTION_L2_128B)
                            : map(&t->wmap, a.W, cuuint64_t(a.K), cuuint64_t(a.M), cuuint64_t(a.groups), ldw,
                                  w_group, e, P1, CU_TENSOR_MAP_L2_PROMOTION_L2_128B);
    return w_ok && map(&t->xmap, a.x, cuuint64_t(a.K), cuuint64_t(a.nvec), cuuint64_t(a.groups), x_vec, x_group, e,
                       16, CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
  }
  template <typename T, bool VEC>
  static void launch(dim3 grid, cudaStream_t s, const Args& a) {
    if constexpr (VEC) {
      kernels::TmaTArgs t;
      if (plan<T>(a, &t)) {
        if constexpr (LOOP) grid.x = loop_grid_x<T>(grid);
        launch_kernel(kKernel<T>, grid, THREADS, s, t, kSmem<T>);
        return;
      }
    }
    if constexpr (TRANS)
      launch_kernel(kernels::gemv_transposed<T, THREADS - 32, P1, 1, NV, false, VEC>, grid, THREADS - 32, s, a);
    else
      launch_kernel(kernels::gemv_rowmajor<T, THREADS - 32, 4, 4 * P1 / (THREADS - 32), 1, NV, false, VEC>, grid,
                    THREADS - 32, s, a);
  }
};
template <int THREADS, int BMC, int BKC, int S, int NV>
using TransposedTma = TmaFamily<true, THREADS, BMC, BKC, S, NV, false>;
template <int THREADS, int BMC, int BKC, int S, int NV>
using TransposedTmaLoop = TmaFamily<true, THREADS, BMC, BKC, S, NV, true>;
template <int THREADS, int BM, int BKC, int S, int NV>
using RowMajorTma = TmaFamily<false, THREADS, BM, BKC, S, NV, false>;
template <int THREADS, int BM, int BKC, int S, int NV>
using RowMajorTmaLoop = TmaFamily<false, THREADS, BM, BKC, S, NV, true>;

// Layout N, weight-only quantised W (Problem::wbits 4 or 8), tensor-core mma with fp32
// accumulation (kernels/gemv_quant.cuh). P1 = lanes that walk a row (4 per warp: P1 / 4 warps
// split K for the same rows), R = 16-row m-tiles per warp, U = chunks per lane in flight, NV =
// vectors per pass over W (8 per n-tile).
// QuantArgs::group_shift of one scale per row (every k in group 0).
constexpr int kPerRowShift = 62;
// The longest quantised row: K (and the k of every element) must fit a signed 32-bit offset.
constexpr int64_t kMaxQuantK = (int64_t(1) << 31) - 64;

template <int THREADS, int P1, int R, int U, int NV>
struct Quant {
  static constexpr bool kTrans = false;
  static constexpr bool kPipelined = false;
  static constexpr bool kTensorCores = true;
  static constexpr int kThreads = THREADS, kNV = NV;
  static constexpr int kRows = THREADS / 32 / (P1 / 4) * 16 * R;
  // K is cut into 16-byte chunks of packed W (32 int4 or 16 int8 values), whatever the alignment.
  static int64_t k_units(const Problem& p, int) { return p.K / (p.wbits == 4 ? 32 : 16); }
  static int64_t min_units_per_split() { return int64_t(P1) * U; }
  static int64_t round_span(int64_t s) { return (s + P1 - 1) / P1 * P1; }
  static int64_t grid_x(const Problem& p, int) { return (p.M + kRows - 1) / kRows; }
  // How the scales are applied (kernels/gemv_quant.cuh): once per row, per chunk tile when a
  // group spans the 4 chunks of a quad, else per weight pair (always, in the unaligned variant).
  template <typename T, int BITS, bool VEC>
  static void launch(dim3 grid, cudaStream_t s, const kernels::QuantArgs& q) {
    using kernels::Scaling;
    constexpr int kQuadShift = BITS == 4 ? 7 : 6;  // log2(4 chunks x 32 or 16 values)
    if constexpr (!VEC)
      launch_kernel(kernels::gemv_quant<T, BITS, THREADS, P1, R, U, NV, false, Scaling::kPre>, grid, THREADS, s, q);
    else if (q.group_shift >= kPerRowShift)
      launch_kernel(kernels::gemv_quant<T, BITS, THREADS, P1, R, U, NV, true, Scaling::kRow>, grid, THREADS, s, q);
    else if (q.group_shift >= kQuadShift)
      launch_kernel(kernels::gemv_quant<T, BITS, THREADS, P1, R, U, NV, true, Scaling::kGroup>, grid, THREADS, s, q);
    else
      launch_kernel(kernels::gemv_quant<T, BITS, THREADS, P1, R, U, NV, true, Scaling::kPre>, grid, THREADS, s, q);
  }
};


// Layout N, quantised W streamed through shared memory by TMA (Hopper; kernels/gemv_quant_tma.cuh):
// THREADS = 32 x (consumer warps + 1), P1 = SK bytes of each row per stage, P2 = S stages per
// warp, U = consumer warps per tile, NV = 8. Persistent: about as many blocks as fit on the GPU
// at once, each group of U warps taking 16-row tiles in turn. Takes int8 and int4 with one scale per row or per group of at least a
// round (64 bytes of a row: int8 g >= 64, int4 g >= 128). Every other call (smaller groups,
// unaligned operands, rows not a multiple of 8 bytes, older GPUs, too little shared memory) runs
// gemv_quant with config 103's shape, whose 16-row blocks and split spans match this family's.
template <int THREADS, int SK, int S, int U, int NV>
struct QuantTma {
  static_assert(NV == kernels::kQuantTmaNV && SK % 256 == 0 && (THREADS / 32 - 1) % U == 0,
                "QuantTma configs: 8 vectors, SK a multiple of 256, UNROLL dividing the consumer warps");
  using Fallback = Quant<128, 16, 1, 2, 8>;
  static constexpr int kStaticRoom = 1024;  // kept for the kernel's static shared memory (barriers)
  static_assert(Fallback::kRows == 16, "the fallback has this family's 16-row blocks");
  static constexpr bool kTrans = false;
  static constexpr bool kPipelined = true;
  static constexpr bool kTensorCores = true;
  static constexpr int kThreads = THREADS, kNV = NV;
  static int64_t k_units(const Problem& p, int vw) { return Fallback::k_units(p, vw); }
  // A split is whole stages (SK / 16 chunks of 16 bytes: whole quads of the fallback too).
  static int64_t min_units_per_split() { return SK / 16; }
  static int64_t round_span(int64_t s) { return (s + SK / 16 - 1) / (SK / 16) * (SK / 16); }
  static int64_t grid_x(const Problem& p, int) { return (p.M + 15) / 16; }

  template <typename T, int BITS, kernels::Scaling SC>
  static auto kernel() {
    return kernels::gemv_quant_tma<T, BITS, THREADS, SK, S, U, SC>;
  }

  // f(std::integral_constant<Scaling, SC>{}) for the scaling of q: per row or per group.
  template <typename F>
  static bool by_scaling(const kernels::QuantArgs& q, F&& f) {
    using kernels::Scaling;
    if (q.group_shift >= kPerRowShift) return f(std::integral_constant<Scaling, Scaling::kRow>{});
    return f(std::integral_constant<Scaling, Scaling::kGroup>{});
  }

  template <typename T, int BITS, bool VEC>
  static void launch(dim3 grid, cudaStream_t s, const kernels::QuantArgs& q) {
    if constexpr (VEC) {
      const bool done = by_scaling(q, [&](auto sc) {
        kernels::QuantTmaArgs t;
        std::size_t smem = 0;
        unsigned gx = 0;
        if (!plan<T, BITS, sc.value>(grid, q, &t, &smem, &gx)) return false;
        launch_kernel(kernel<T, BITS, sc.value>(), dim3(gx, grid.y, grid.z), THREADS, s, t, smem);
        return true;
      });
      if (done) return;
    }
    Fallback::template launch<T, BITS, VEC>(grid, s, q);
  }

  // Whether the TMA kernel takes a call (for the tests: `uses_tma`).
  template <typename T, int BITS>
  static bool takes(dim3 grid, const kernels::QuantArgs& q) {
    return by_scaling(q, [&](auto sc) {
      kernels::QuantTmaArgs t;
      std::size_t smem = 0;
      unsigned gx = 0;
      return plan<T, BITS, sc.value>(grid, q, &t, &smem, &gx);
    });
  }

  // The TMA launch of a call (kernel argument, dynamic shared memory, blocks along x), or false
  // where the TMA kernel cannot take it.
  template <typename T, int BITS, kernels::Scaling SC>
  static bool plan(dim3 grid, const kernels::QuantArgs& q, kernels::QuantTmaArgs* t, std::size_t* smem,
                   unsigned* gx) {
    constexpr int CW = THREADS / 32 - 1;
    constexpr int VPB = 8 / BITS;  // values per byte
    const Args& a = q.a;
    const DeviceInfo& dev = device_info();
    const EncodeTiled encode = encode_tiled();
    const int64_t row_bytes = a.K / VPB;
    // rows of whole 8-byte elements; groups of whole 64-byte rounds (a power of two >= 64 VPB)
    if (!dev.hopper || encode == nullptr || a.K % (8 * VPB) != 0) return false;
    if (SC == kernels::Scaling::kGroup && (q.group_shift < (BITS == 4 ? 7 : 6) || q.group_shift >= kPerRowShift))
      return false;
    if ((a.nvec > 1 && a.x_vec % 8 != 0) || (a.groups > 1 && a.x_group % 8 != 0)) return false;
    const int64_t ldw = a.M > 1 ? a.ldw : (row_bytes + 15) / 16 * 16;
    const int64_t w_group = a.groups > 1 ? a.w_group : ldw * a.M;
    if (ldw % 16 != 0 || w_group % 16 != 0) return false;
    // x of the longest split (the last one also takes the partial chunk at the end of a row), in
    // whole stages.
    const int64_t last = row_bytes - int64_t(grid.y - 1) * a.split_span * 16;
    const int64_t x_elems = (std::max(a.split_span * 16, last) + SK - 1) / SK * SK * VPB;
    const int room = dev.smem_optin - kStaticRoom;
    if (x_elems > (int64_t(1) << 20) || room <= 0) return false;
    const int nv = int(std::min<int64_t>(a.nvec, NV));
    *smem = kernels::quant_tma_smem<T, CW, SK, S, U, VPB>(
        nv, int(x_elems), kernels::quant_tma_round_sums(SC, BITS, q.zeros != nullptr, a.nvec));
    if (*smem > std::size_t(room)) return false;
    static std::atomic<int8_t> state[64] = {};
    if (!smem_ok(kernel<T, BITS, SC>(), room, state)) return false;
    // Blocks per SM, queried once per device for each dynamic shared memory size in turn (the
    // last size asked, with its answer + 1, packed: size << 16 | answer + 1).
    static std::atomic<int64_t> occupancy[64] = {};
    if (dev.id < 0) return false;
    int64_t known = occupancy[dev.id].load(std::memory_order_relaxed);
    int per_sm = 0;
    if ((known >> 16) == int64_t(*smem) && (known & 0xFFFF) > 0) {
      per_sm = int(known & 0xFFFF) - 1;
    } else {
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel<T, BITS, SC>(), THREADS, *smem) != cudaSuccess) {
        cudaGetLastError();
        return false;
      }
      occupancy[dev.id].store((int64_t(*smem) << 16) | (per_sm + 1), std::memory_order_relaxed);
    }
    if (per_sm < 1) return false;
    *t = kernels::QuantTmaArgs{};
    t->q = q;
    t->x_elems = int32_t(x_elems);
    // The first boxes asked of L2 before the wait, where the launch overlaps the previous kernel
    // and K is not split (split K: slower on the H100 and the H200, benchmarks/NOTES.md).
    t->prefetch = pdl_enabled() && grid.y == 1 ? 1 : 0;
    const cuuint64_t dims[3] = {cuuint64_t(row_bytes / 8), cuuint64_t(a.M), cuuint64_t(a.groups)};
    const cuuint64_t strides[2] = {cuuint64_t(ldw), cuuint64_t(w_group)};
    const cuuint32_t box[3] = {SK / 8, 16, 1}, step[3] = {1, 1, 1};
    // 128-byte L2 promotions: with evict_first (l2_evict_first, kernels/common.cuh), 256 ran up to 6% slower across a
    // rotation of 4x L2 (not measured again past 32x; benchmarks/NOTES.md).
    if (encode(&t->map, CU_TENSOR_MAP_DATA_TYPE_UINT64, 3, const_cast<void*>(a.W), dims, strides, box, step,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return false;
    // As many blocks as run at once over the (split, group, vector-chunk) slices, and no more
    // than give every group of U consumer warps a tile, but at least one block per SM while there
    // are tiles (some warps then have none: every SM streams).
    const int64_t slices = int64_t(grid.y) * grid.z;
    const int64_t resident = (int64_t(dev.sms) * per_sm + slices - 1) / slices;
    const int64_t tiles = grid.x;  // 16-row tiles
    const int64_t wanted = std::max<int64_t>((tiles + CW / U - 1) / (CW / U), std::min<int64_t>(tiles, (dev.sms + slices - 1) / slices));
    *gx = unsigned(std::max<int64_t>(1, std::min<int64_t>(wanted, resident)));
    return true;
  }
};

template <typename Fam>
struct IsQuant : std::false_type {};
template <int THREADS, int P1, int R, int U, int NV>
struct IsQuant<Quant<THREADS, P1, R, U, NV>> : std::true_type {};
template <int THREADS, int SK, int S, int U, int NV>
struct IsQuant<QuantTma<THREADS, SK, S, U, NV>> : std::true_type {};
template <typename Fam>
struct IsQuantTma : std::false_type {};
template <int THREADS, int SK, int S, int U, int NV>
struct IsQuantTma<QuantTma<THREADS, SK, S, U, NV>> : std::true_type {};
template <typename Fam>
struct IsTmaFamily : std::false_type {};
template <bool TRANS, int THREADS, int P1, int P2, int S, int NV, bool LOOP>
struct IsTmaFamily<TmaFamily<TRANS, THREADS, P1, P2, S, NV, LOOP>> : std::true_type {};

#define GEMVX_INFO(id, fam, th, p1, p2, u, nv)                                            \
  ConfigInfo{id, fam<th, p1, p2, u, nv>::kTrans, fam<th, p1, p2, u, nv>::kPipelined,         \
             fam<th, p1, p2, u, nv>::kTensorCores, th, p1, p2, u, nv,                         \
             IsQuant<fam<th, p1, p2, u, nv>>::value, #fam},
constexpr ConfigInfo kConfigs[] = {GEMVX_CONFIGS(GEMVX_INFO)};
#undef GEMVX_INFO
constexpr int kNumConfigs = int(sizeof(kConfigs) / sizeof(kConfigs[0]));

inline bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }
inline bool stride16(int64_t stride_elems, int64_t extent, std::size_t esize) {
  // A stride matters only when the dimension has more than one entry.
  return extent <= 1 || (stride_elems * int64_t(esize)) % 16 == 0;
}

// 16-byte loads need W (and, row-major, x) rows that all start on 16-byte boundaries.
inline bool vector_ok(const Problem& p) {
  const std::size_t es = dtype_size(p.dtype);
  const int64_t stored_rows = p.trans ? p.K : p.M;
  bool ok = aligned16(p.W) && stride16(p.ldw, stored_rows, es) && stride16(p.w_group, p.groups, es);
  if (!p.trans)
    ok = ok && aligned16(p.x) && stride16(p.x_vec, p.nvec, es) && stride16(p.x_group, p.groups, es);
  return ok;
}

template <typename T>
int vec_width(bool vec) {
  return vec ? int(16 / sizeof(T)) : 1;
}

// Split plan for a family: how many splits, and the span (in the K units of the variant that runs)
// each covers. The count depends on sizes only, never on pointer alignment, so workspace_bytes()
// computed for a plan matches every launch of it; the span is then cut from the units of the
// variant that runs (16-byte chunks or elements), so the splits always cover all of K.
template <typename Fam>
void plan_splits(const Problem& p, bool vec, int requested, int64_t* span, int* splits) {
  const int vw = int(16 / dtype_size(p.dtype));
  const int64_t units = Fam::k_units(p, vw);
  int s = std::max(requested, 1);
  // Each split must get at least one full unrolled step of every lane.
  const int64_t max_useful = std::max<int64_t>(1, units / Fam::min_units_per_split());
  if (s > max_useful) s = int(max_useful);
  if (s > 65535) s = 65535;
  const int64_t run_units = Fam::k_units(p, vec ? vw : 1);
  const int64_t sp = Fam::round_span((run_units + s - 1) / s);
  *span = sp > 0 ? sp : Fam::round_span(1);
  *splits = s;
}

inline Args make_args(const Problem& p) {
  Args a{};
  a.W = p.W;
  a.x = p.x;
  a.y = p.y;
  a.y_in = p.y_in;
  a.M = p.M;
  a.K = p.K;
  a.groups = p.groups;
  a.nvec = p.nvec;
  a.ldw = p.ldw;
  a.w_group = p.w_group;
  a.x_vec = p.x_vec;
  a.x_group = p.x_group;
  a.y_vec = p.y_vec;
  a.y_group = p.y_group;
  a.y_in_vec = p.y_in_vec;
  a.y_in_group = p.y_in_group;
  a.alpha = p.alpha;
  a.beta = p.beta;
  return a;
}

inline Status from_cuda(cudaError_t e) {
  if (e == cudaSuccess) return {};
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorInitializationError)
    return {Code::kNoDevice, int32_t(e)};
  return {Code::kCudaError, int32_t(e)};
}

template <typename T>
Status launch_finish(const Args& a, cudaStream_t s) {
  const int64_t n = a.groups * a.nvec * a.M;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65535);
  launch_kernel(kernels::finish<T>, dim3(unsigned(blocks)), 256, s, a);
  return from_cuda(cudaGetLastError());
}

// The part of a launch every family shares: the split plan, the workspace check, the grid (z
// cut into launches of at most 65535 (group, vector-chunk) slices) and the split-K second pass.
// `a` is the Args inside the kernel's argument block; launch_one(grid) launches the kernel.
// The split plan and vector chunks of a launch (into a), and its blocks along x.
template <typename Fam, typename T>
int64_t plan_grid(const Problem& p, bool vec, int requested_splits, Args& a) {
  int splits;
  plan_splits<Fam>(p, vec, requested_splits, &a.split_span, &splits);
  a.splits = splits;
  a.vchunks = int32_t((p.nvec + Fam::kNV - 1) / Fam::kNV);
  return Fam::grid_x(p, vec_width<T>(vec));
}

template <typename Fam, typename T, typename Launch>
Status run_grid(const Problem& p, bool vec, int requested_splits, void* ws, std::size_t ws_size,
                cudaStream_t stream, Args& a, Launch&& launch_one) {
  const int64_t gx = plan_grid<Fam, T>(p, vec, requested_splits, a);
  const int splits = a.splits;
  a.ws = static_cast<float*>(ws);
  if (splits > 1) {
    const std::size_t need = std::size_t(splits) * p.groups * p.nvec * p.M * sizeof(float);
    if (ws == nullptr || ws_size < need) return {Code::kWorkspaceTooSmall, 0};
  }
  if (gx > 0x7fffffff) return {Code::kUnsupported, 0};
  const int64_t total_z = p.groups * a.vchunks;
  cudaGetLastError();  // clear a stale, non-sticky error so it is not reported as ours
  for (int64_t z0 = 0; z0 < total_z; z0 += kMaxGridZ) {
    a.z_offset = z0;
    launch_one(dim3(unsigned(gx), unsigned(splits), unsigned(std::min(kMaxGridZ, total_z - z0))));
    Status st = from_cuda(cudaGetLastError());
    if (!st.ok()) return st;
  }
  if (splits > 1) return launch_finish<T>(a, stream);
  return {};
}

template <typename Fam, typename T>
Status run_typed(const Problem& p, int requested_splits, void* ws, std::size_t ws_size,
                 cudaStream_t stream) {
  const bool vec = vector_ok(p);
  Args a = make_args(p);
  return run_grid<Fam, T>(p, vec, requested_splits, ws, ws_size, stream, a, [&](dim3 grid) {
    if (vec)
      Fam::template launch<T, true>(grid, stream, a);
    else
      Fam::template launch<T, false>(grid, stream, a);
  });
}

// ----- quantised W --------------------------------------------------------------------------

// 16-byte loads of packed W need every row (and matrix) to start on a 16-byte boundary; x as in
// the dense row-major kernels. Scales and zero points are read element-wise.
inline bool quant_vector_ok(const Problem& p) {
  const std::size_t xs = dtype_size(p.dtype);
  return aligned16(p.W) && stride16(p.ldw, p.M, 1) && stride16(p.w_group, p.groups, 1) &&
         aligned16(p.x) && stride16(p.x_vec, p.nvec, xs) && stride16(p.x_group, p.groups, xs);
}

inline kernels::QuantArgs make_quant_args(const Problem& p) {
  kernels::QuantArgs q{};
  q.a = make_args(p);
  q.scales = p.scales;
  q.zeros = p.zeros;
  q.lds = p.lds;
  q.s_group = p.s_group;
  q.ldz = p.ldz;
  q.z_group = p.z_group;
  int shift = 0;
  while (p.group_size > 0 && (int64_t(1) << shift) < p.group_size) ++shift;
  q.group_shift = p.group_size > 0 ? shift : kPerRowShift;  // per channel: every k in group 0
  q.scale_dtype = int32_t(p.scale_dtype);
  return q;
}

template <typename Fam, typename T, int BITS>
Status run_quant_typed(const Problem& p, int requested_splits, void* ws, std::size_t ws_size,
                       cudaStream_t stream) {
  // The kernel addresses inside a row with 32-bit offsets (k, bytes and chunks of a row).
  if (p.K > kMaxQuantK) return {Code::kUnsupported, 0};
  const bool vec = quant_vector_ok(p);
  kernels::QuantArgs q = make_quant_args(p);
  return run_grid<Fam, T>(p, vec, requested_splits, ws, ws_size, stream, q.a, [&](dim3 grid) {
    if (vec)
      Fam::template launch<T, BITS, true>(grid, stream, q);
    else
      Fam::template launch<T, BITS, false>(grid, stream, q);
  });
}

template <typename Fam>
Status run_quant(const Problem& p, int splits, void* ws, std::size_t ws_size, cudaStream_t stream) {
  const bool f16 = p.dtype == DType::kFloat16;
  if (p.wbits == 4)
    return f16 ? run_quant_typed<Fam, __half, 4>(p, splits, ws, ws_size, stream)
               : run_quant_typed<Fam, __nv_bfloat16, 4>(p, splits, ws, ws_size, stream);
  return f16 ? run_quant_typed<Fam, __half, 8>(p, splits, ws, ws_size, stream)
             : run_quant_typed<Fam, __nv_bfloat16, 8>(p, splits, ws, ws_size, stream);
}

template <typename Fam>
Status run_dense(const Problem& p, int splits, void* ws, std::size_t ws_size, cudaStream_t stream) {
  if (Fam::kTrans != p.trans) return {Code::kInvalidConfig, 0};
  switch (p.dtype) {
    case DType::kFloat32:
      return run_typed<Fam, float>(p, splits, ws, ws_size, stream);
    case DType::kFloat16:
      return run_typed<Fam, __half>(p, splits, ws, ws_size, stream);
    case DType::kBFloat16:
      return run_typed<Fam, __nv_bfloat16>(p, splits, ws, ws_size, stream);
  }
  return {Code::kInvalidArgument, 0};
}

template <typename Fam>
Status run(const Problem& p, int splits, void* ws, std::size_t ws_size, cudaStream_t stream) {
  if constexpr (IsQuant<Fam>::value)
    return run_quant<Fam>(p, splits, ws, ws_size, stream);
  else
    return run_dense<Fam>(p, splits, ws, ws_size, stream);
}

// Whether the launch of a QuantTma or dense TMA config would take the TMA kernel (its first
// grid slice).
template <typename Fam>
bool tma_for(const Problem& p, int splits) {
  if constexpr (IsTmaFamily<Fam>::value) {
    if (p.trans != Fam::kTrans || p.wbits != 0 || !vector_ok(p) || p.K == 0) return false;
    (void)splits;
    kernels::TmaTArgs t;
    return p.dtype == DType::kFloat32 ? Fam::template plan<float>(make_args(p), &t)
                                      : Fam::template plan<__half>(make_args(p), &t);
  } else if constexpr (!IsQuantTma<Fam>::value) {
    return false;
  } else {
    if (p.trans || !quant_vector_ok(p) || p.K == 0 || p.K > kMaxQuantK) return false;
    auto takes = [&](auto t, auto bits) {
      using T = decltype(t);
      kernels::QuantArgs q = make_quant_args(p);
      const int64_t gx = plan_grid<Fam, T>(p, true, splits, q.a);
      const int64_t z = std::min(kMaxGridZ, p.groups * q.a.vchunks);
      return Fam::template takes<T, decltype(bits)::value>(dim3(unsigned(gx), unsigned(q.a.splits), unsigned(z)), q);
    };
    const bool f16 = p.dtype == DType::kFloat16;
    if (p.wbits == 4)
      return f16 ? takes(__half{}, std::integral_constant<int, 4>{}) : takes(__nv_bfloat16{}, std::integral_constant<int, 4>{});
    return f16 ? takes(__half{}, std::integral_constant<int, 8>{}) : takes(__nv_bfloat16{}, std::integral_constant<int, 8>{});
  }
}

// kPathPrefetch and kPathLean of a launch (launch.h): the row-major CUDA-core families only.
template <typename Fam>
int rowmajor_paths(const Problem& p, int splits) {
  if constexpr (IsQuant<Fam>::value || Fam::kTrans || Fam::kTensorCores) {
    return 0;
  } else if constexpr (!Fam::kPrefetch && !Fam::kLean) {
    return 0;
  } else {
    if (p.trans || p.wbits != 0 || p.K == 0) return 0;
    auto flags = [&](auto t) {
      using T = decltype(t);
      const bool vec = vector_ok(p);
      Args a = make_args(p);
      const int64_t gx = plan_grid<Fam, T>(p, vec, splits, a);
      const dim3 grid(unsigned(gx), unsigned(a.splits), unsigned(std::min(kMaxGridZ, p.groups * a.vchunks)));
      a.prefetch_blocks = vec ? Fam::template prefetching<T, true>(grid) : Fam::template prefetching<T, false>(grid);
      kernels::LeanArgs l;
      const bool lean = Fam::kLean && vec && lean_args(a, int(16 / sizeof(T)), &l);
      return (a.prefetch_blocks != 0 ? kPathPrefetch : 0) | (lean ? kPathLean : 0);
    };
    switch (p.dtype) {
      case DType::kFloat32:
        return flags(float{});
      case DType::kFloat16:
        return flags(__half{});
      case DType::kBFloat16:
        return flags(__nv_bfloat16{});
    }
    return 0;
  }
}

// The launch paths of a config for a problem (launch.h: kPathTma, kPathPrefetch, kPathLean).
template <typename Fam>
int paths_for(const Problem& p, int splits) {
  return (tma_for<Fam>(p, splits) ? kPathTma : 0) | rowmajor_paths<Fam>(p, splits);
}

template <typename Fam>
int splits_for(const Problem& p, int splits) {
  int64_t span;
  int s;
  plan_splits<Fam>(p, true, splits, &span, &s);
  return s;
}


// Config id -> part: the translation unit (launch_part.cu.in, GEMVX_LAUNCH_PART = part) that
// instantiates its kernels.
constexpr int kLaunchParts = 8;
constexpr int part_of(int id) { return id % kLaunchParts; }

// The three operations on the configs of part PART (defined in launch_part.cuh, instantiated
// once per part); each returns false for an id outside its part or unknown.
template <int PART>
bool part_run(int id, const Problem& p, int splits, void* ws, std::size_t ws_size, cudaStream_t stream,
              Status* st);
template <int PART>
bool part_splits(int id, const Problem& p, int splits, int* out);
template <int PART>
bool part_paths(int id, const Problem& p, int splits, int* out);

}  // namespace detail
}  // namespace gemvx
