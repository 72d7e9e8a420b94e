// Small device helpers shared by the GEMV kernels: element conversion, 16-byte loads with cache
// hints, warp reduction, and the argument block every kernel receives.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace gemvx {
namespace kernels {

// Everything a kernel needs, passed by value. Strides are in elements.
//
// Field order matters for small shapes: the block lives in a constant bank, and the first read of
// each 64-byte line of it on an SM is a miss that stalls the warp (in order, one line after
// another). The fields are ordered by first use in the row-major and transposed kernels
// (benchmarks/NOTES.md, "Kernel prologue").
struct Args {
  // Read before the first load (the kernel parameters start 16 bytes into a 64-byte line on
  // sm_90, so these 112 bytes are two lines).
  const void* W;
  const void* x;
  int64_t M, K;
  int64_t ldw;
  int64_t split_span;  // K-units (16-byte chunks for RowMajor, rows of W for Transposed) per split
  int64_t z_offset;    // first (group, vector-chunk) index of this launch
  int64_t w_group, x_group, x_vec;
  int64_t nvec;
  int32_t vchunks;     // ceil(nvec / NV)
  int32_t prefetch_blocks;  // the first blocks (in launch order) that prefetch W: rowmajor_start
  int32_t splits;      // 1: write y directly; >1: write partial sums to ws
  float alpha, beta;
  // Read by the stores, and by batched, beta != 0 or split-K calls.
  void* y;
  int64_t y_vec, y_group;
  int64_t groups;
  const void* y_in;
  int64_t y_in_vec, y_in_group;
  float* ws;  // split-K partial sums: [split][group][vec][M] fp32
};
static_assert(offsetof(Args, y) == 112,
              "Args: the fields read before the first load must stay in the first 112 bytes");

// The argument block of one plain GEMV on the row-major CUDA-core kernel (gemv_rowmajor.cuh):
// y = alpha W x (+ beta y_in), one vector, one matrix, no split, K a whole number of 16-byte
// chunks, 32-bit sizes (launch_impl.cuh, lean_args). Everything but y_in (read only when
// beta != 0) lies in the first 48 bytes: one 64-byte line of the constant bank (kernel parameters
// start 16 bytes into one on sm_90), where Args needs two before the first load and a third for
// the store.
struct LeanArgs {
  const void* W;
  const void* x;
  void* y;
  int32_t M, K, ldw;
  float alpha, beta;
  const void* y_in;
};
static_assert(offsetof(LeanArgs, y_in) == 48, "LeanArgs: the fields every call reads in 48 bytes");

// Raw storage for one load: 16 bytes in the vector body, one element in the scalar path.
template <typename T, bool VEC>
using Raw = std::conditional_t<VEC, uint4, T>;

template <typename T, bool VEC>
inline constexpr int kVecWidth = VEC ? int(16 / sizeof(T)) : 1;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

__device__ __forceinline__ float2 pair_to_float2(uint32_t u, __half) {
  return __half22float2(*reinterpret_cast<const __half2*>(&u));
}
__device__ __forceinline__ float2 pair_to_float2(uint32_t u, __nv_bfloat16) {
  // bf16 -> fp32 is a shift: the low element goes to the high half of a float.
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}

// Unpack one raw load into VW floats.
template <typename T>
__device__ __forceinline__ void unpack(const uint4& r, float (&f)[16 / sizeof(T)]) {
  if constexpr (std::is_same_v<T, float>) {
    f[0] = __uint_as_float(r.x);
    f[1] = __uint_as_float(r.y);
    f[2] = __uint_as_float(r.z);
    f[3] = __uint_as_float(r.w);
  } else {
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 p = pair_to_float2(w[i], T{});
      f[2 * i] = p.x;
      f[2 * i + 1] = p.y;
    }
  }
}
template <typename T>
__device__ __forceinline__ void unpack(const T& r, float (&f)[1]) {
  f[0] = to_float(r);
}

// W is streamed once: read-only path, no L1 allocation.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}
template <typename T>
__device__ __forceinline__ T load_stream(const T* p) {
  return __ldg(p);
}

// x is small and reused by every row: keep it cached.
__device__ __forceinline__ uint4 load_keep(const uint4* p) { return __ldg(p); }
template <typename T>
__device__ __forceinline__ T load_keep(const T* p) {
  return __ldg(p);
}

// Programmatic dependent launch (Hopper and newer). pdl_wait() waits until the previous kernel on
// the stream has finished and its writes are visible; every kernel calls it before it reads or
// writes global memory, so reads and writes stay ordered as on a plain stream. pdl_trigger() lets
// the next kernel be scheduled (its blocks then wait in their own pdl_wait), so its launch latency
// overlaps this kernel's tail. The GEMV kernels trigger once their W loads are done: triggering at
// the start made transposed shapes up to 15% slower on an H200 (the waiting blocks of the next
// kernel then sit on the SMs for the whole run), triggering late costs nothing on row-major ones
// (benchmarks/NOTES.md). Older GPUs: no-ops, and the launcher does not ask for the overlap.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// An L2 cache policy whose lines L2 evicts first, for W, which is read once (sm_80 and newer; the
// `.L2::cache_hint` copies of gemv_tile.cuh and tma.cuh take it). Measured with copies rotated
// past 32x L2: the tile kernels and TransposedTma 0.2-3.7% faster with it (H200, H100), QuantTma
// within 2% either way. (Across only 4x L2 it kept part of W in L2 and looked up to 15% faster;
// benchmarks/NOTES.md.)
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t p;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}

// Sum across groups of WIDTH consecutive lanes (WIDTH a power of two <= 32); every lane of the
// group receives the total.
template <int WIDTH>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int off = WIDTH / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// What one block works on: its split of K (blockIdx.y), its matrix g and its first vector v0 of the
// nv (<= NV) vectors it handles (blockIdx.z, offset by the launch's z_offset), and the matching
// starts of W and x.
template <typename T, int NV, typename P = Args>
struct BlockWork {
  int split;
  int64_t g, v0;
  int nv;
  const T* W;
  const T* X;
  __device__ __forceinline__ explicit BlockWork(const Args& a) {
    split = blockIdx.y;
    const int64_t z = a.z_offset + blockIdx.z;
    if (a.vchunks == 1) {  // one chunk of vectors per matrix: no division
      g = z;
      v0 = 0;
    } else {
      g = z / a.vchunks;
      v0 = (z % a.vchunks) * NV;
    }
    nv = NV == 1 ? 1 : int(a.nvec - v0 < NV ? a.nvec - v0 : NV);  // v0 < nvec always
    W = static_cast<const T*>(a.W) + g * a.w_group;
    X = static_cast<const T*>(a.x) + g * a.x_group + v0 * a.x_vec;
  }
};
// LeanArgs: one block row of one GEMV.
template <typename T>
struct BlockWork<T, 1, LeanArgs> {
  static constexpr int split = 0, nv = 1;
  static constexpr int64_t g = 0, v0 = 0;
  const T* W;
  const T* X;
  __device__ __forceinline__ explicit BlockWork(const LeanArgs& a)
      : W(static_cast<const T*>(a.W)), X(static_cast<const T*>(a.x)) {}
};

// Args::prefetch_blocks: before pdl_wait(), each of the grid's first prefetch_blocks blocks (the
// ones resident from the start) asks L2 for the bytes of W that its first loads read, so their
// DRAM latency overlaps the previous kernel's tail instead of following it (the launcher decides
// when: launch_impl.cuh, prefetch_blocks). This is safe whatever the previous kernel writes: a
// prefetch moves nothing into registers, shared memory or L1, and L2 is the GPU's point of
// coherence, so a line written after it was prefetched is updated in L2 before the loads after
// pdl_wait() read it. x is not prefetched: every block reads the same x, and as many prefetches
// of the same few lines as there are blocks made large shapes up to 2.4 times slower
// (benchmarks/NOTES.md).
//
// The prologue of the row-major kernel, called before pdl_wait() when Args::prefetch_blocks is
// not 0: one bulk L2 prefetch (Hopper's TMA unit: one instruction whatever the size) of each of
// the block's ROWS rows of W, SPAN 16-byte chunks (elements when !VEC) from its split's first,
// spread over the threads. A range is widened to whole 16-byte granules, as the instruction
// needs; a granule that holds a byte of an allocation lies inside it. Not inlined, so the
// kernel's own code and register allocation stay as they are without it.
template <typename T, int ROWS, int SPAN, bool VEC>
__device__ __noinline__ void rowmajor_start(const Args* a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int64_t block = blockIdx.x + int64_t(gridDim.x) * (blockIdx.y + int64_t(gridDim.y) * blockIdx.z);
  if (block >= a->prefetch_blocks) return;
  constexpr int UNIT = VEC ? int(16 / sizeof(T)) : 1;  // elements per K unit
  const BlockWork<T, 1> bw(*a);
  const int64_t units = a->K / UNIT;
  const int64_t c0 = min(int64_t(bw.split) * a->split_span, units);
  const int64_t bytes = min(min(int64_t(SPAN), a->split_span), units - c0) * UNIT * int64_t(sizeof(T));
  const int64_t row0 = int64_t(blockIdx.x) * ROWS;
  const uintptr_t first = reinterpret_cast<uintptr_t>(bw.W + row0 * a->ldw + c0 * UNIT);
  const int64_t rows = min(int64_t(ROWS), a->M - row0);
  if (bytes <= 0) return;
  for (int i = threadIdx.x; i < rows; i += blockDim.x) {
    const uintptr_t start = first + uintptr_t(i * a->ldw * int64_t(sizeof(T)));
    const uintptr_t lo = start & ~uintptr_t(15), hi = (start + uintptr_t(bytes) + 15) & ~uintptr_t(15);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(lo), "r"(uint32_t(hi - lo)) : "memory");
  }
#endif
}

// alpha * acc + beta * y_in as T, where y_in() reads the output's old value (called only when
// beta != 0, so y_in is not read when beta == 0): one output's value, for both argument blocks.
template <typename T, typename YIn>
__device__ __forceinline__ T scaled_output(float alpha, float beta, float acc, YIn&& y_in) {
  float out = alpha * acc;
  if (beta != 0.0f) out += beta * to_float(y_in());
  return from_float<T>(out);
}

// y[g, v, m] = alpha * acc + beta * y_in[g, v, m]: the final store of one output, by store_output
// and by the split-K finish pass (finish.cuh).
template <typename T>
__device__ __forceinline__ void store_final(const Args& a, int64_t g, int64_t v, int64_t m, float acc) {
  static_cast<T*>(a.y)[g * a.y_group + v * a.y_vec + m] = scaled_output<T>(a.alpha, a.beta, acc, [&] {
    return static_cast<const T*>(a.y_in)[g * a.y_in_group + v * a.y_in_vec + m];
  });
}

// A kernel's store of one output: store_final, or the partial sum into the split-K workspace.
template <typename T>
__device__ __forceinline__ void store_output(const Args& a, int split, int64_t g, int64_t v,
                                             int64_t m, float acc) {
  if (a.splits > 1) {
    a.ws[((int64_t(split) * a.groups + g) * a.nvec + v) * a.M + m] = acc;
    return;
  }
  store_final<T>(a, g, v, m, acc);
}
template <typename T>
__device__ __forceinline__ void store_output(const LeanArgs& a, int, int64_t, int64_t, int64_t m,
                                             float acc) {
  static_cast<T*>(a.y)[m] =
      scaled_output<T>(a.alpha, a.beta, acc, [&] { return static_cast<const T*>(a.y_in)[m]; });
}

}  // namespace kernels
}  // namespace gemvx
