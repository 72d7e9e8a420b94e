"""Measurement helpers shared by the tuner (``gemvx.tune``) and the benchmark (benchmarks/bench.py).

CuPy is passed in (``cp``) rather than imported, so importing this module needs neither CuPy nor
a GPU. Everything here runs on the GPU: random operands, the float64 reference, the error
measure, NaN poisoning of outputs, and a streaming-read kernel (the benchmark's bandwidth ceiling
and the tuner's L2 flush).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# Relative-norm error allowed for gemvx against the float64 reference (the rule of the test
# suite): the output rounding of float16/bfloat16 (4x the unit roundoff) plus, for the fp32
# accumulation, 4 u32 sqrt(K).
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
_U32 = 2.0**-24


# Outputs rotated on their own, beside the rotated copies of W (the benchmark's graphs, the
# tuner's sustained timing): past Y_ROTATE_L2 x L2 where MAX_Y_COPIES of them get there.
Y_ROTATE_L2 = 2
MAX_Y_COPIES = 512


def output_copies(n: int, y_bytes: int, l2_bytes: int) -> int:
    """Outputs to rotate (call i writes output i % ny) beside n rotated copies of W: a multiple of
    n whose outputs alone pass Y_ROTATE_L2 x L2, at most MAX_Y_COPIES (or n, where n is already
    more).

    With the W copies alone, a large W has few copies (2 at W >= 32x L2) and each output comes
    back while its lines are still in L2; a kernel that reads W with an L2 evict-first policy then
    never pays for writing y back to HBM, while one whose stores go to HBM anyway (cuBLAS) does.
    Outputs of their own past L2 make every implementation pay for its y (benchmarks/README.md)."""
    if y_bytes <= 0:
        return n
    k = math.ceil(Y_ROTATE_L2 * l2_bytes / (n * y_bytes))
    return n * max(1, min(k, MAX_Y_COPIES // n))


def tolerance(dtype: str, K: int) -> float:
    return TOL[dtype] + 4.0 * _U32 * math.sqrt(max(K, 1))


def np_dtype(name: str) -> np.dtype:
    """NumPy dtype for a dtype name (bfloat16 from ml_dtypes, which also registers it with CuPy)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def from_f32(cp: Any, a: Any, dt: np.dtype) -> Any:
    """float32 CuPy array -> dtype dt. bfloat16: CuPy's cast, else round-to-nearest-even on the
    bits (only the dtype object is needed from CuPy then)."""
    if a.dtype == dt:
        return a
    try:
        return a.astype(dt)
    except Exception:  # a CuPy without bfloat16 casts
        if dt.name != "bfloat16":
            raise
        u = a.view(cp.uint32)
        r = (u + cp.uint32(0x7FFF) + ((u >> 16) & cp.uint32(1))) >> 16
        return r.astype(cp.uint16).view(dt)


def as_f64(cp: Any, a: Any) -> Any:
    """CuPy array -> float64 (bfloat16 through its bits if CuPy cannot cast it)."""
    try:
        return a.astype(cp.float64)
    except Exception:
        if a.dtype.name != "bfloat16":
            raise
        return (a.view(cp.uint16).astype(cp.uint32) << 16).view(cp.float32).astype(cp.float64)


def random_normal(cp: Any, rs: Any, shape: tuple[int, ...], dt: np.dtype) -> Any:
    """Standard-normal values of dtype dt from CuPy RandomState ``rs`` (never all zeros)."""
    return from_f32(cp, rs.standard_normal(shape, dtype=cp.float32), dt)


def random_quantized(cp: Any, rs: Any, bits: int, group_size: int | None, asym: bool, M: int,
                     K: int) -> Any:
    """A QuantizedWeight of CuPy arrays from RandomState ``rs``: codes random over their whole
    range, float16 scales in [0.01, 0.1], zero points 0..15 (``asym``, int4 only)."""
    from .quant import QuantizedWeight

    if bits == 8:
        packed = rs.randint(-128, 128, (M, K), dtype=cp.int8)
    else:
        packed = rs.randint(0, 256, (M, (K + 1) // 2), dtype=cp.uint8)
    sshape = (M,) if group_size is None else (M, math.ceil(K / group_size))
    scales = rs.uniform(0.01, 0.1, sshape).astype(cp.float16)
    zeros = rs.randint(0, 16, sshape, dtype=cp.uint8) if asym else None
    return QuantizedWeight(packed, scales, zeros, bits=bits, group_size=group_size, K=K)


def quant_reference(cp: Any, q: Any, x: Any, chunk_bytes: int = 256 << 20) -> Any:
    """float64 ``dequantize(q) @ x`` on the GPU, in row chunks of at most ``chunk_bytes`` of
    float64 (q a QuantizedWeight of one (M, K) matrix)."""
    from .quant import QuantizedWeight, dequantize

    M, K = q.shape
    step = max(1, chunk_bytes // (8 * max(K, 1)))
    x64 = as_f64(cp, x)
    ref = cp.empty(x.shape[:-1] + (M,), cp.float64)
    for r0 in range(0, M, step):
        part = QuantizedWeight(q.packed[r0:r0 + step], q.scales[r0:r0 + step],
                               None if q.zeros is None else q.zeros[r0:r0 + step],
                               bits=q.bits, group_size=q.group_size, K=K)
        ref[..., r0:r0 + step] = x64 @ dequantize(part, cp.float64).T
    return ref


def reference(cp: Any, W: Any, x: Any, transpose: bool, chunk_bytes: int = 256 << 20) -> Any:
    """float64 ``op(W) @ x`` for x of shape (K,) or (batch, K), computed on the GPU in chunks of
    W of at most ``chunk_bytes`` of float64. W is (M, K), or stored (K, M) with ``transpose``."""
    x64 = as_f64(cp, x)
    if not transpose:
        M, K = W.shape
        step = max(1, chunk_bytes // (8 * K))
        ref = cp.empty(x.shape[:-1] + (M,), dtype=cp.float64)
        for r0 in range(0, M, step):
            ref[..., r0:r0 + step] = x64 @ as_f64(cp, W[r0:r0 + step]).T
    else:
        K, M = W.shape
        step = max(1, chunk_bytes // (8 * M))
        ref = cp.zeros(x.shape[:-1] + (M,), dtype=cp.float64)
        for k0 in range(0, K, step):
            ref += x64[..., k0:k0 + step] @ as_f64(cp, W[k0:k0 + step])
    return ref


def rel_err(cp: Any, y: Any, ref: Any) -> float:
    """||y - ref|| / ||ref|| over all entries (NaN anywhere in y gives NaN)."""
    num = float(cp.linalg.norm((as_f64(cp, y) - ref).ravel()))
    den = float(cp.linalg.norm(ref.ravel()))
    return num / den if den > 0 else num


# Quiet-NaN bit patterns by dtype name (filled through an integer view: no float kernel needed).
_NAN_BITS = {"float16": ("uint16", 0x7E00), "bfloat16": ("uint16", 0x7FC0),
             "float32": ("uint32", 0x7FC00000)}


def poison(y: Any) -> None:
    """Fill an output with NaN so an implementation that writes nothing cannot pass a check."""
    kind, bits = _NAN_BITS[y.dtype.name]
    y.view(kind).fill(bits)


# Streaming read: grid-stride over 16-byte words, 4 independent loads in flight per thread,
# XOR-folded so no load can be dropped; one 32-bit value written per block.
_READ_KERNEL = r"""
extern "C" __global__ void __launch_bounds__(256)
gemvx_read_@TAG@(const uint4* __restrict__ src, unsigned long long n16,
                 unsigned int* __restrict__ out) {
  unsigned int acc = 0u;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 a = GEMVX_LOAD(i);
    uint4 b = GEMVX_LOAD(i + stride);
    uint4 c = GEMVX_LOAD(i + 2 * stride);
    uint4 d = GEMVX_LOAD(i + 3 * stride);
    acc ^= (a.x ^ a.y ^ a.z ^ a.w) ^ (b.x ^ b.y ^ b.z ^ b.w)
         ^ (c.x ^ c.y ^ c.z ^ c.w) ^ (d.x ^ d.y ^ d.z ^ d.w);
  }
  for (; i < n16; i += stride) {
    uint4 a = GEMVX_LOAD(i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  __shared__ unsigned int block_acc;
  if (threadIdx.x == 0) block_acc = 0u;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) atomicXor(&block_acc, acc);
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = block_acc;
}
"""
# Load flavours: plain, and evict-first (__ldcs).
READ_VARIANTS = {"ld": "src[(IDX)]", "ldcs": "__ldcs(src + (IDX))"}


class StreamRead:
    """A kernel that reads a whole buffer once with 16-byte loads (``variant`` of READ_VARIANTS,
    ``blocks_per_sm`` resident blocks of 256 threads per SM). Calling it launches on CuPy's
    current stream (so a stream capture records it)."""

    def __init__(self, cp: Any, src: Any, sm_count: int, variant: str = "ld", blocks_per_sm: int = 8):
        if src.nbytes % 16 or src.data.ptr % 16:
            raise ValueError("StreamRead: the buffer must be 16-byte aligned and sized")
        code = f"#define GEMVX_LOAD(IDX) {READ_VARIANTS[variant]}\n" + _READ_KERNEL.replace("@TAG@", variant)
        self.kernel = cp.RawKernel(code, f"gemvx_read_{variant}")
        self.blocks = max(1, sm_count) * blocks_per_sm
        self.out = cp.empty(self.blocks, dtype=cp.uint32)
        self.args = (src, np.uint64(src.nbytes // 16), self.out)
        self.nbytes = src.nbytes

    def __call__(self, *_: Any) -> None:
        self.kernel((self.blocks,), (256,), self.args)
