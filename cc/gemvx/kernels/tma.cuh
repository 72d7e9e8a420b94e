// Hopper's tensor memory accelerator (TMA) and shared-memory barriers (mbarrier), for the kernels
// that stream W through shared memory with bulk copies (gemv_quant_tma.cuh, gemv_tma.cuh).
// sm_90 and newer only: the callers compile these under the same architecture guard.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace gemvx {
namespace kernels {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
namespace tma {
__device__ __forceinline__ uint32_t addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// A consumer warp hands a stage it has read back to the producer: each lane's proxy fence orders
// its reads of the stage (ldmatrix, ld.shared: the generic proxy) before the async proxy's writes
// (the TMA refill that lane 0's arrival on `bar` allows). Without the fence the refill could land
// under reads still in flight: TransposedTmaLoop 160-thread fp16, 64 splits, 16 vectors, gave a
// wrong sum in 3 to 15 of 30 launches on an H100 and none with it (benchmarks/NOTES.md).
__device__ __forceinline__ void release(uint32_t bar) {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncwarp();
  if (threadIdx.x % 32 == 0) arrive(bar);
}
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// bytes (a multiple of 16) from global src (16-byte aligned) to shared dst, counted on bar.
__device__ __forceinline__ void copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
// The box at (c0, c1, c2) of the tensor map to shared dst, counted on bar.
__device__ __forceinline__ void box(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
// As box, with an L2 eviction policy (l2_evict_first, common.cuh).
__device__ __forceinline__ void box_hint(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, uint32_t bar,
                                         uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
      "[%1, {%2, %3, %4}], [%5], %6;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "l"(policy)
      : "memory");
}
// Asks L2 for the box at (c0, c1, c2) of the tensor map (nothing is written anywhere).
__device__ __forceinline__ void prefetch_box(const CUtensorMap* map, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.prefetch.tensor.3d.L2.global [%0, {%1, %2, %3}];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
}  // namespace tma
#endif

}  // namespace kernels
}  // namespace gemvx
