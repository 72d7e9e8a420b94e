"""Streaming-read patterns with no math: how fast can W be read in the order a kernel reads it?

Each kernel only loads W (16-byte read-only loads without L1 allocation, as the kernels stream
it) and folds the words into one value, so the
time is the read pattern's alone. The patterns are those of the gemvx kernel families on layout N:

- ``wide``: one row per 128-thread block, four 16-byte loads in flight per thread, a warp's load
  covers 512 contiguous bytes (the batch-1 CUDA-core kernels);
- ``tile-uU``: the tensor-core multi-vector kernels (gemv_mma): a warp owns one 8-row tile, lane
  (g, t) loads row g at chunk base + 4u + t, so a warp reads 64 U bytes of each of 8 rows per step
  and every row of W is streamed at once (one wave of blocks);
- ``tile-u2 + x of N``: ``tile-u2`` plus the kernel's x loads for a batch of N (lane (g, t)
  loads the same chunk of vector g, and of g + 8 for 16 vectors), still no math;
- ``rows8``: as ``tile-u8`` (a warp owns 8 rows, 128 bytes of W per lane in flight), but each
  load of the warp covers 512 contiguous bytes of one row;
- ``rows8-side-kK``: as ``rows8``, with K warps side by side on a block's 8 rows (512 K
  contiguous bytes of each row per step), many waves of small blocks;
- ``side-kKuU``: K warps side by side on the same 8 rows (a block reads 64 K bytes of a row per
  load), many waves of small blocks;
- ``tile-u2 occ``: ``tile-u2`` with dynamic shared memory reserved only to cut the blocks per SM.

    python benchmarks/read_patterns.py [--shape 28672x8192] [--reps 10]

Prints the median time per kernel (CUDA events, 10 launches after 3 warm-ups; W is far larger
than L2) and the read rate. benchmarks/NOTES.md has what it showed.
"""

from __future__ import annotations

import argparse

SRC = r"""
__device__ __forceinline__ unsigned fold(const uint4& v) { return v.x ^ v.y ^ v.z ^ v.w; }
// W as the kernels stream it: read-only, no L1 allocation (x, in tile_x, keeps __ldg).
__device__ __forceinline__ uint4 stream(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

extern "C" __global__ void wide(const uint4* __restrict__ W, long long k16, unsigned* out) {
  const uint4* r = W + (long long)blockIdx.x * k16;
  unsigned s = 0;
  for (long long c = threadIdx.x; c < k16; c += 4 * 128) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = c + u * 128 < k16 ? stream(r + c + u * 128) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < 4; ++u) s ^= fold(v[u]);
  }
  if (s == 0x9e3779b9u) out[0] = s;  // never true in practice; keeps the loads
}

template <int U>
__device__ void tile(const uint4* __restrict__ W, long long k16, unsigned* out) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const long long row = ((long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * 8 + g;
  unsigned s = 0;
  for (long long b = 0; b + 4 * U <= k16; b += 4 * U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = stream(W + row * k16 + b + 4 * u + t);
#pragma unroll
    for (int u = 0; u < U; ++u) s ^= fold(v[u]);
  }
  if (s == 0x9e3779b9u) out[0] = s;
}

// As tile with U = 2, plus the x loads of the multi-vector kernel: lane (g, t) also loads the same
// chunk of vectors g and g + 8 (NV = 16) or of vector g < 4 (NV = 4) from X (16 vectors of k16 chunks).
template <int NV>
__device__ void tile_x(const uint4* __restrict__ W, const uint4* __restrict__ X, long long k16, unsigned* out) {
  constexpr int U = 2;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const long long row = ((long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * 8 + g;
  const bool has_a = g < NV, has_b = g + 8 < NV;
  unsigned s = 0;
  for (long long b = 0; b + 4 * U <= k16; b += 4 * U) {
    uint4 v[U], xa[U], xb[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      v[u] = stream(W + row * k16 + b + 4 * u + t);
      xa[u] = has_a ? __ldg(X + g * k16 + b + 4 * u + t) : make_uint4(0, 0, 0, 0);
      xb[u] = has_b ? __ldg(X + (g + 8) * k16 + b + 4 * u + t) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) s ^= fold(v[u]) ^ fold(xa[u]) ^ fold(xb[u]);
  }
  if (s == 0x9e3779b9u) out[0] = s;
}
extern "C" __global__ void tile_x16(const uint4* W, const uint4* X, long long k16, unsigned* out) { tile_x<16>(W, X, k16, out); }
extern "C" __global__ void tile_x4(const uint4* W, const uint4* X, long long k16, unsigned* out) { tile_x<4>(W, X, k16, out); }

// As tile, but each load of the warp covers 512 contiguous bytes of one of its 8 rows.
extern "C" __global__ void rows8(const uint4* __restrict__ W, long long k16, unsigned* out) {
  const int lane = threadIdx.x % 32;
  const long long row0 = ((long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * 8;
  unsigned s = 0;
  for (long long b = 0; b + 32 <= k16; b += 32) {
    uint4 v[8];
#pragma unroll
    for (int r = 0; r < 8; ++r) v[r] = stream(W + (row0 + r) * k16 + b + lane);
#pragma unroll
    for (int r = 0; r < 8; ++r) s ^= fold(v[r]);
  }
  if (s == 0x9e3779b9u) out[0] = s;
}

// As rows8, with K warps side by side on the block's 8 rows (512 K contiguous bytes of a row per
// step), many waves of small blocks.
template <int K>
__device__ void rows8_side(const uint4* __restrict__ W, long long k16, unsigned* out) {
  const int lane = threadIdx.x % 32, wk = threadIdx.x / 32;
  const long long row0 = (long long)blockIdx.x * 8;
  unsigned s = 0;
  for (long long b = 32 * wk; b + 32 <= k16; b += 32 * K) {
    uint4 v[8];
#pragma unroll
    for (int r = 0; r < 8; ++r) v[r] = stream(W + (row0 + r) * k16 + b + lane);
#pragma unroll
    for (int r = 0; r < 8; ++r) s ^= fold(v[r]);
  }
  if (s == 0x9e3779b9u) out[0] = s;
}
extern "C" __global__ void rows8_k2(const uint4* W, long long k16, unsigned* out) { rows8_side<2>(W, k16, out); }
extern "C" __global__ void rows8_k4(const uint4* W, long long k16, unsigned* out) { rows8_side<4>(W, k16, out); }
extern "C" __global__ void rows8_k8(const uint4* W, long long k16, unsigned* out) { rows8_side<8>(W, k16, out); }

template <int U, int K>
__device__ void side(const uint4* __restrict__ W, long long k16, unsigned* out) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, wk = threadIdx.x / 32;
  const long long row = (long long)blockIdx.x * 8 + g;
  unsigned s = 0;
  for (long long b = 0; b + 4 * U * K <= k16; b += 4 * U * K) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = stream(W + row * k16 + b + 4 * (u * K + wk) + t);
#pragma unroll
    for (int u = 0; u < U; ++u) s ^= fold(v[u]);
  }
  if (s == 0x9e3779b9u) out[0] = s;
}

extern "C" __global__ void tile_u2(const uint4* W, long long k16, unsigned* out) { tile<2>(W, k16, out); }
extern "C" __global__ void tile_u4(const uint4* W, long long k16, unsigned* out) { tile<4>(W, k16, out); }
extern "C" __global__ void tile_u8(const uint4* W, long long k16, unsigned* out) { tile<8>(W, k16, out); }
extern "C" __global__ void side_k4u2(const uint4* W, long long k16, unsigned* out) { side<2, 4>(W, k16, out); }
extern "C" __global__ void side_k4u4(const uint4* W, long long k16, unsigned* out) { side<4, 4>(W, k16, out); }
extern "C" __global__ void side_k8u2(const uint4* W, long long k16, unsigned* out) { side<2, 8>(W, k16, out); }
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="28672x8192", help="M x K of an fp16 W (M a multiple of 64, K of 2048)")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    M, K = (int(v) for v in args.shape.lower().split("x"))
    if M % 64 or K % 2048:
        ap.error("--shape: M must be a multiple of 64 and K of 2048 (every pattern covers all of W)")
    import cupy as cp

    mod = cp.RawModule(code=SRC, options=("-std=c++17",))
    k16 = 2 * K // 16
    W = cp.random.randint(0, 2**31 - 1, size=(M * K // 2,), dtype=cp.int32)
    X = cp.random.randint(0, 2**31 - 1, size=(16 * K // 2,), dtype=cp.int32)
    out = cp.zeros(1, cp.uint32)
    nbytes = 2 * M * K
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}: W {M}x{K} fp16, "
          f"{nbytes / 2**20:.0f} MiB, median of {args.reps}")

    def run(label: str, name: str, grid: int, block: int, smem: int = 0) -> None:
        f = mod.get_function(name)
        if smem:
            f.max_dynamic_shared_size_bytes = smem
        kargs = (W, X, cp.int64(k16), out) if name.startswith("tile_x") else (W, cp.int64(k16), out)
        call = (lambda: f((grid,), (block,), kargs, shared_mem=smem))
        for _ in range(3):
            call()
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for _ in range(args.reps):
            start.record()
            call()
            stop.record()
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop) * 1e3)
        t = sorted(times)[len(times) // 2]
        print(f"  {label:18s} grid {grid:6d} x {block:3d}  smem {smem:6d}: {t:8.1f} us {nbytes / t / 1e3:6.0f} GB/s")

    run("wide", "wide", M, 128)
    for u in (2, 4, 8):
        run(f"tile-u{u}", f"tile_u{u}", M // 32, 128)
    run("tile-u2 256 thr", "tile_u2", M // 64, 256)
    run("tile-u2 + x of 4", "tile_x4", M // 32, 128)
    run("tile-u2 + x of 16", "tile_x16", M // 32, 128)
    run("rows8", "rows8", M // 32, 128)
    for k in (2, 4, 8):
        run(f"rows8-side-k{k}", f"rows8_k{k}", M // 8, 32 * k)
    for smem in (60000, 110000):
        run("tile-u2 occ", "tile_u2", M // 32, 128, smem)
    run("side-k4u2", "side_k4u2", M // 8, 128)
    run("side-k4u4", "side_k4u4", M // 8, 128)
    run("side-k8u2", "side_k8u2", M // 8, 256)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
