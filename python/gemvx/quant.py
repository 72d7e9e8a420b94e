"""Weight-only quantised weights: the :class:`QuantizedWeight` container, :func:`quantize`,
:func:`dequantize`, and converters from the GPTQ and AWQ int4 checkpoint layouts.

Format (the kernels read exactly this; shapes for one matrix, leading batch dims allowed):

============  ===========================================  =========================================
field         bits = 8                                     bits = 4
============  ===========================================  =========================================
``packed``    int8 (M, K), one signed code q per element   uint8 (M, ceil(K/2)); byte b of a row
                                                           holds k = 2b in its low nibble and
                                                           k = 2b + 1 in its high nibble (the high
                                                           nibble of the last byte is padding, 0,
                                                           when K is odd)
``scales``    float16, bfloat16 or float32; (M,) per output channel (``group_size=None``), or
              (M, ceil(K/g)) for groups of g consecutive k (``group_size=g``, a power of two >= 32;
              the last group may be partial)
``zeros``     none (symmetric)                             none (symmetric: codes are q + 8 for q in
                                                           [-8, 7], i.e. zero point 8), or uint8 of
                                                           the shape of ``scales`` holding the
                                                           integer zero point z in [0, 15]
                                                           (asymmetric; only the low 4 bits count)
============  ===========================================  =========================================

The weight is ``W[m, k] = (q[m, k] - z[m, j]) * s[m, j]`` with ``j = k // g`` (j = 0 per channel),
z = 0 for int8. The arrays may be NumPy, CuPy or JAX arrays; :func:`quantize` returns the kind
it was given. A QuantizedWeight is a JAX pytree (leaves ``packed``, ``scales``, ``zeros``;
``bits``, ``group_size`` and ``K`` are static), registered when JAX is imported.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Callable

import numpy as np

BITS = (4, 8)
SCALE_DTYPES = ("float32", "float16", "bfloat16")
X_DTYPES = ("float16", "bfloat16")
PER_CHANNEL_SHIFT = 62


class QuantizedWeight:
    """A weight-only quantised matrix (or batch of matrices) in the gemvx format (module doc).

    Parameters
    ----------
    packed : array
        int8 (..., M, K) for ``bits=8``; uint8 (..., M, ceil(K/2)) for ``bits=4``.
    scales : array
        float16, bfloat16 or float32; (..., M) per channel, or (..., M, ceil(K/group_size)).
    zeros : array or None
        uint8 zero points of the shape of ``scales`` (int4 only); None for symmetric.
    bits : int
        8 or 4.
    group_size : int or None
        K entries per scale (a power of two >= 32), None for one scale per output channel.
    K : int
        Number of columns (the packed width of int4 does not say whether K is odd).

    Nothing is checked here (JAX rebuilds the object from arbitrary leaves inside its
    transformations); the doors check every field before they launch and raise TypeError /
    ValueError naming it. :meth:`check` runs the same checks on demand.
    """

    __slots__ = ("packed", "scales", "zeros", "bits", "group_size", "K")

    def __init__(self, packed: Any, scales: Any, zeros: Any = None, *, bits: int,
                 group_size: int | None = None, K: int) -> None:
        self.packed, self.scales, self.zeros = packed, scales, zeros
        self.bits, self.group_size, self.K = bits, group_size, K
        if "jax" in sys.modules:
            register_jax_pytree()

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical shape (..., M, K) of the weight."""
        return tuple(int(d) for d in self.packed.shape[:-1]) + (int(self.K),)

    @property
    def ndim(self) -> int:
        return len(self.packed.shape)

    @property
    def symmetric(self) -> bool:
        return self.zeros is None

    @property
    def nbytes(self) -> int:
        """Bytes of packed codes, scales and zero points."""
        return sum(int(a.size) * np.dtype(a.dtype).itemsize for a in self._arrays())

    def _arrays(self) -> tuple[Any, ...]:
        return tuple(a for a in (self.packed, self.scales, self.zeros) if a is not None)

    def map(self, fn: Callable[[Any], Any]) -> QuantizedWeight:
        """A QuantizedWeight with ``fn`` applied to each array, e.g. ``q.map(cupy.asarray)`` or
        ``q.map(jax.numpy.asarray)`` to move it between frameworks."""
        z = None if self.zeros is None else fn(self.zeros)
        return QuantizedWeight(fn(self.packed), fn(self.scales), z, bits=self.bits,
                               group_size=self.group_size, K=self.K)

    def check(self, name: str = "W") -> QuantSpec:
        """Check every field (TypeError / ValueError naming it); the layout the kernels see."""
        return check_quantized(self, name)

    def __repr__(self) -> str:
        g = "per-channel" if self.group_size is None else f"group_size={self.group_size}"
        kind = "symmetric" if self.zeros is None else "asymmetric"
        sd = np.dtype(self.scales.dtype).name if hasattr(self.scales, "dtype") else "?"
        return (f"QuantizedWeight(int{self.bits}, shape={self.shape}, {g}, {kind}, scales {sd}, "
                f"{type(self.packed).__module__.split('.')[0]})")


# ---- JAX pytree -------------------------------------------------------------------------------------

_JAX_REGISTERED = False


def register_jax_pytree() -> None:
    """Register QuantizedWeight as a JAX pytree (and for jax.export serialization).

    Done when this module is imported after JAX, when a QuantizedWeight is made while JAX is
    imported, and when the JAX door is first used. A QuantizedWeight of NumPy arrays made before
    JAX was imported and handed straight to a JAX transformation needs this call first (or
    ``q.map(jax.numpy.asarray)``, which makes a new object)."""
    global _JAX_REGISTERED
    if _JAX_REGISTERED:
        return
    import jax

    def flatten(q: QuantizedWeight):
        return (q.packed, q.scales, q.zeros), (q.bits, q.group_size, q.K)

    def unflatten(aux: tuple[int, int | None, int], leaves: tuple[Any, Any, Any]) -> QuantizedWeight:
        q = object.__new__(QuantizedWeight)
        q.packed, q.scales, q.zeros = leaves
        q.bits, q.group_size, q.K = aux
        return q

    jax.tree_util.register_pytree_node(QuantizedWeight, flatten, unflatten)
    # jax.export can then serialize functions that take a QuantizedWeight (the static fields go
    # into the artifact as JSON)
    try:
        from jax import export as jax_export
    except ImportError:  # a jax without jax.export
        jax_export = None
    register = getattr(jax_export, "register_pytree_node_serialization", None)
    if register is not None:
        import json

        register(QuantizedWeight, serialized_name="gemvx.QuantizedWeight",
                 serialize_auxdata=lambda aux: json.dumps(list(aux)).encode(),
                 deserialize_auxdata=lambda data: tuple(json.loads(data)))
    _JAX_REGISTERED = True


if "jax" in sys.modules:
    register_jax_pytree()


# ---- checks -------------------------------------------------------------------------------------------

class QuantSpec:
    """What the kernels need to know of a checked QuantizedWeight."""

    __slots__ = ("bits", "group_size", "K", "M", "batch", "ngroups", "scale_dtype", "has_zeros",
                 "per_channel_scales")

    def __init__(self, **kw: Any) -> None:
        for k, v in kw.items():
            setattr(self, k, v)

    @property
    def group_shift(self) -> int:
        return PER_CHANNEL_SHIFT if self.group_size is None else int(self.group_size).bit_length() - 1

    @property
    def row_bytes(self) -> int:
        return (self.K + 1) // 2 if self.bits == 4 else self.K

    def table_key(self, x_dtype: str) -> str:
        """The dtype key of the heuristic table, e.g. "int4g128-float16", "int8c-bfloat16",
        "int4g128z-float16" (with zero points)."""
        g = "c" if self.group_size is None else f"g{self.group_size}"
        return f"int{self.bits}{g}{'z' if self.has_zeros else ''}-{x_dtype}"


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _shape(a: Any, what: str) -> tuple[int, ...]:
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
        raise TypeError(f"gemvx: {what} must be an array; got {type(a).__name__}")
    return tuple(int(d) for d in a.shape)


def check_quantized(q: Any, name: str = "W") -> QuantSpec:
    """Every check of a QuantizedWeight the doors make before a launch; TypeError for dtypes and
    types, ValueError for values and shapes, each naming the field."""
    if not isinstance(q, QuantizedWeight):
        raise TypeError(f"gemvx: {name} must be a gemvx.QuantizedWeight; got {type(q).__name__}")
    bits, g, K = q.bits, q.group_size, q.K
    if not _is_int(bits) or int(bits) not in BITS:
        raise ValueError(f"gemvx: {name}.bits must be 8 or 4; got {bits!r}")
    bits = int(bits)
    if g is not None and (not _is_int(g) or g < 32 or int(g) & (int(g) - 1)):
        raise ValueError(f"gemvx: {name}.group_size must be None (per channel) or a power of two "
                         f">= 32; got {g!r}")
    if not _is_int(K) or K < 0:
        raise ValueError(f"gemvx: {name}.K must be a non-negative integer; got {K!r}")
    g = None if g is None else int(g)
    K = int(K)
    pshape = _shape(q.packed, f"{name}.packed")
    want_w = "int8" if bits == 8 else "uint8"
    if np.dtype(q.packed.dtype).name != want_w:
        what = "one signed code per element" if bits == 8 else "two int4 codes per byte along K"
        raise TypeError(f"gemvx: {name}.packed has dtype {np.dtype(q.packed.dtype).name}; expected "
                        f"{want_w} for bits={bits} ({what})")
    if len(pshape) < 2:
        raise ValueError(f"gemvx: {name}.packed must have at least 2 dimensions (..., M, bytes); "
                         f"got shape {pshape}")
    row_bytes = (K + 1) // 2 if bits == 4 else K
    if pshape[-1] != row_bytes:
        want = f"ceil(K/2) = {row_bytes}" if bits == 4 else f"K = {K}"
        raise ValueError(f"gemvx: {name}.packed has {pshape[-1]} bytes per row; expected {want} "
                         f"for bits={bits} and K={K}")
    batch, M = pshape[:-2], pshape[-2]
    ngroups = 1 if g is None else math.ceil(K / g)
    sshape = _shape(q.scales, f"{name}.scales")
    sd = np.dtype(q.scales.dtype).name
    if sd not in SCALE_DTYPES:
        raise TypeError(f"gemvx: {name}.scales has dtype {sd}; expected one of {', '.join(SCALE_DTYPES)}")
    want_s = batch + ((M,) if g is None else (M, ngroups))
    if sshape != want_s:
        how = "(..., M) for one scale per output channel" if g is None else \
            f"(..., M, ceil(K/group_size)) with K={K}, group_size={g}"
        raise ValueError(f"gemvx: {name}.scales has shape {sshape}; expected {want_s}: {how}")
    if q.zeros is not None:
        if bits != 4:
            raise ValueError(f"gemvx: {name}.zeros must be None for bits=8 (int8 is symmetric)")
        zshape = _shape(q.zeros, f"{name}.zeros")
        if np.dtype(q.zeros.dtype).name != "uint8":
            raise TypeError(f"gemvx: {name}.zeros has dtype {np.dtype(q.zeros.dtype).name}; expected "
                            "uint8 (integer zero points in [0, 15])")
        if zshape != want_s:
            raise ValueError(f"gemvx: {name}.zeros has shape {zshape}; expected {want_s} (the shape "
                             "of the scales)")
    return QuantSpec(bits=bits, group_size=g, K=K, M=M, batch=batch, ngroups=ngroups,
                     scale_dtype=sd, has_zeros=q.zeros is not None, per_channel_scales=g is None)


def check_x_dtype(x: Any, name: str = "x") -> str:
    """x of a quantised call: float16 or bfloat16 (the kernels dequantise W to x's dtype)."""
    dx = np.dtype(x.dtype)
    if not dx.isnative:
        raise TypeError(f"gemvx: {name} has non-native byte order ({dx.str}); expected native")
    if dx.name not in X_DTYPES:
        raise TypeError(f"gemvx: {name} has dtype {dx.name}; a quantised W takes float16 or bfloat16 "
                        f"{name} (the result has {name}'s dtype)")
    return dx.name


# ---- array modules ------------------------------------------------------------------------------------

def array_module(a: Any) -> Any:
    """numpy, cupy or jax.numpy: the module that made ``a``."""
    mod = type(a).__module__.split(".")[0]
    if mod == "numpy":
        return np
    if mod == "cupy":
        import cupy

        return cupy
    if mod in ("jax", "jaxlib"):
        import jax.numpy as jnp

        return jnp
    raise TypeError(f"gemvx: expected a NumPy, CuPy or JAX array; got {type(a).__name__}")


def _dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _bitcast(xp: Any, a: Any, dtype: Any) -> Any:
    """Reinterpret the bits of ``a`` as a dtype of the same size."""
    if xp is np or xp.__name__ == "cupy":
        return a.view(dtype)
    import jax

    return jax.lax.bitcast_convert_type(a, dtype)


def _round_up(xp: Any, s: Any, dtype: np.dtype) -> Any:
    """float32 ``s`` (>= 0) in ``dtype``, rounded up (so that no value of a group lands past the end
    of the code range): round to nearest, then one step up where that fell below."""
    if dtype == np.float32:
        return s.astype(np.float32)
    r = s.astype(dtype)
    below = r.astype(np.float32) < s
    bits = _bitcast(xp, r, np.uint16)
    return _bitcast(xp, xp.where(below, bits + np.uint16(1), bits), dtype)


def _scale_divisor(xp: Any, s: Any) -> Any:
    return xp.where(s > 0, s.astype(np.float32), np.float32(1))


# ---- quantize / dequantize ----------------------------------------------------------------------------

def quantize(W: Any, bits: int = 8, group_size: int | None = None, symmetric: bool = True,
             scale_dtype: Any = None) -> QuantizedWeight:
    """Quantise a float matrix (or batch, ``(..., M, K)``) to the gemvx format, rounding to nearest.

    Parameters
    ----------
    W : NumPy, CuPy or JAX array (..., M, K) of float16, bfloat16, float32 or float64; finite.
    bits : 8 or 4.
    group_size : None (one scale per output channel) or a power of two >= 32 (g consecutive k
        share a scale; K need not be a multiple of g).
    symmetric : True: s = max|W| / qmax per group (qmax 127 or 7), q = round(W / s). False (int4
        only): the group's range [min(W, 0), max(W, 0)] is mapped onto [0, 15]: s = range / 15,
        z = round(-min / s), q = round(W / s) + z.
    scale_dtype : dtype of the scales (float16, bfloat16 or float32); default W's dtype when it is
        one of those, float32 for float64.

    Returns
    -------
    QuantizedWeight whose arrays are of W's kind (NumPy, CuPy or JAX). Error bound: every
    element satisfies ``|W - dequantize(q)| <= s / 2 + 2^-22 |W|`` with s the stored scale of its
    group: round to nearest gives s / 2; scales are stored rounded up to their dtype, so no value
    is clamped; the second term covers W / s being formed in float32 (a quotient within 2^-24 of
    a half-way point may round either way).
    """
    xp = array_module(W)
    if not _is_int(bits) or int(bits) not in BITS:
        raise ValueError(f"gemvx: bits must be 8 or 4; got {bits!r}")
    if group_size is not None and (not _is_int(group_size) or group_size < 32
                                   or int(group_size) & (int(group_size) - 1)):
        raise ValueError(f"gemvx: group_size must be None (per channel) or a power of two >= 32; "
                         f"got {group_size!r}")
    if not isinstance(symmetric, (bool, np.bool_)):
        raise TypeError(f"gemvx: symmetric must be a bool; got {type(symmetric).__name__}")
    if bits == 8 and not symmetric:
        raise ValueError("gemvx: int8 quantisation is symmetric only (symmetric=False needs bits=4)")
    wd = np.dtype(W.dtype).name
    if wd not in ("float16", "bfloat16", "float32", "float64"):
        raise TypeError(f"gemvx: W has dtype {wd}; expected float16, bfloat16, float32 or float64")
    if W.ndim < 2:
        raise ValueError(f"gemvx: W must have at least 2 dimensions (..., M, K); got shape {tuple(W.shape)}")
    if scale_dtype is None:
        scale_dtype = wd if wd in SCALE_DTYPES else "float32"
    sd = _dtype(np.dtype(scale_dtype).name if not isinstance(scale_dtype, str) else scale_dtype)
    if sd.name not in SCALE_DTYPES:
        raise TypeError(f"gemvx: scale_dtype {sd.name} is not one of {', '.join(SCALE_DTYPES)}")

    *batch, M, K = (int(d) for d in W.shape)
    g = K if group_size is None else int(group_size)
    G = 1 if group_size is None else math.ceil(K / g)
    Wf = W.astype(np.float32)
    if K == 0:  # no columns: empty codes, unit scales
        Wg = Wf.reshape(tuple(batch) + (M, G, 0))
    else:
        pad = G * g - K
        if pad:  # repeat the last column: the group's max / min do not change
            Wf = xp.pad(Wf, [(0, 0)] * (W.ndim - 1) + [(0, pad)], mode="edge")
        Wg = Wf.reshape(tuple(batch) + (M, G, g))
    if symmetric:
        qmax = 127 if bits == 8 else 7
        amax = xp.abs(Wg).max(axis=-1) if K else xp.zeros(Wg.shape[:-1], np.float32)
        s = _round_up(xp, amax / np.float32(qmax), sd)
        q = xp.clip(xp.rint(Wg / _scale_divisor(xp, s)[..., None]), -qmax - 1, qmax)
        codes = q.astype(np.int8) if bits == 8 else (q + 8).astype(np.uint8)
        zeros = None
    else:
        lo = xp.minimum(Wg.min(axis=-1), 0) if K else xp.zeros(Wg.shape[:-1], np.float32)
        hi = xp.maximum(Wg.max(axis=-1), 0) if K else xp.zeros(Wg.shape[:-1], np.float32)
        s = _round_up(xp, (hi - lo) / np.float32(15), sd)
        div = _scale_divisor(xp, s)
        z = xp.clip(xp.rint(-lo / div), 0, 15)
        codes = xp.clip(xp.rint(Wg / div[..., None]) + z[..., None], 0, 15).astype(np.uint8)
        zeros = z.astype(np.uint8)
    codes = codes.reshape(tuple(batch) + (M, G * g))[..., :K]
    packed = codes if bits == 8 else pack_int4(xp, codes)
    if group_size is None:
        s = s.reshape(tuple(batch) + (M,))
        zeros = None if zeros is None else zeros.reshape(tuple(batch) + (M,))
    return QuantizedWeight(packed, s, zeros, bits=bits, group_size=group_size, K=K)


def pack_int4(xp: Any, codes: Any) -> Any:
    """uint8 codes in [0, 15] (..., M, K) -> (..., M, ceil(K/2)), even k in the low nibble."""
    if codes.shape[-1] % 2:
        codes = xp.pad(codes, [(0, 0)] * (codes.ndim - 1) + [(0, 1)])
    codes = codes.astype(np.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << np.uint8(4))


def unpack_codes(q: QuantizedWeight) -> Any:
    """The integer codes q (..., M, K): int8 values for bits=8, 0..15 for bits=4 (int32 array of
    the weight's kind)."""
    xp = array_module(q.packed)
    if q.bits == 8:
        return q.packed.astype(np.int32)
    p = q.packed.astype(np.int32)
    both = xp.stack([p & 15, p >> 4], axis=-1)
    return both.reshape(tuple(p.shape[:-1]) + (2 * int(p.shape[-1]),))[..., : q.K]


def _per_element(xp: Any, a: Any, q: QuantizedWeight) -> Any:
    """Per-group values (..., M) or (..., M, G) broadcast to (..., M, K)."""
    if q.group_size is None:
        return a[..., None]
    return xp.repeat(a, q.group_size, axis=-1)[..., : q.K]


def centered_codes(q: QuantizedWeight, dtype: Any = np.float32) -> Any:
    """q - z per element (..., M, K) as ``dtype``: exact small integers."""
    xp = array_module(q.packed)
    c = unpack_codes(q)
    if q.bits == 4:
        z = 8 if q.zeros is None else _per_element(xp, q.zeros.astype(np.int32) & 15, q)
        c = c - z
    return c.astype(dtype)


def dequantize(q: QuantizedWeight, dtype: Any = None) -> Any:
    """``(q - z) * s`` as a dense (..., M, K) array of the weight's kind.

    ``dtype`` defaults to the scales' dtype. The product is formed in float64 when ``dtype`` is
    float64 and in float32 otherwise (exact for float16 / bfloat16 scales), then cast once.
    """
    spec = check_quantized(q, "q")
    out = _dtype(spec.scale_dtype) if dtype is None else np.dtype(dtype)
    work = np.float64 if out == np.float64 else np.float32
    xp = array_module(q.packed)
    s = _per_element(xp, q.scales.astype(work), q)
    return (centered_codes(q, work) * s).astype(out)


# ---- GPTQ / AWQ ---------------------------------------------------------------------------------------

_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble j of an AWQ int32 holds column 8i + _AWQ_ORDER[j]


def _nibbles(xp: Any, a: Any) -> Any:
    """int32 words (..., n) -> uint8 (..., n, 8): nibble j (bits 4j..4j+3) of each word."""
    return xp.stack([((a >> (4 * j)) & 15).astype(np.uint8) for j in range(8)], axis=-1)


def _word_bytes(xp: Any, a: Any) -> Any:
    """int32 (rows, n) C-ordered -> its little-endian bytes, uint8 (rows, 4n)."""
    if xp is np or xp.__name__ == "cupy":
        return xp.ascontiguousarray(a).view(np.uint8)
    import jax

    return jax.lax.bitcast_convert_type(a, np.uint8).reshape(int(a.shape[0]), -1)


def _contiguous(xp: Any, a: Any) -> Any:
    return xp.ascontiguousarray(a) if xp is np or xp.__name__ == "cupy" else a


def _check_words(qweight: Any) -> None:
    if np.dtype(qweight.dtype).name not in ("int32", "uint32"):
        raise TypeError(f"gemvx: qweight has dtype {np.dtype(qweight.dtype).name}; expected int32 "
                        "(eight int4 codes per word)")
    if qweight.ndim != 2:
        raise ValueError(f"gemvx: qweight must be 2-D; got shape {tuple(qweight.shape)}")


def _finish(xp: Any, packed: Any, scales: Any, zeros: Any, group_size: int, K: int) -> QuantizedWeight:
    """(N, ...) arrays -> a checked QuantizedWeight; GPTQ's group_size -1 is per channel."""
    g = None if group_size == -1 else group_size
    if g is None:
        scales, zeros = scales.reshape(-1), zeros.reshape(-1)
    q = QuantizedWeight(_contiguous(xp, packed), _contiguous(xp, scales), _contiguous(xp, zeros),
                        bits=4, group_size=g, K=K)
    q.check("the converted weight")
    return q


def from_gptq(qweight: Any, qzeros: Any, scales: Any, *, group_size: int, g_idx: Any = None,
              zero_offset: int = 1) -> QuantizedWeight:
    """Convert a GPTQ int4 layer (AutoGPTQ / Hugging Face format) to a QuantizedWeight.

    GPTQ stores ``qweight`` int32 (K/8, N) with k = 8i + j in nibble j of word [i, n],
    ``qzeros`` int32 (ceil(K/g), N/8) with column n = 8i + j in nibble j of word [grp, i], holding
    z - ``zero_offset`` (the classic format stores z - 1; GPTQ "v2" checkpoints store z: pass 0),
    and ``scales`` (ceil(K/g), N). The layer computes ``x @ W`` with ``W[k, n] = (q - z) * s``; as
    a gemvx weight that is M = N rows of K. The repack is one transpose of the int32 words, whose
    little-endian bytes are already "even k in the low nibble": ``qweight.T`` viewed as uint8 is
    ``packed``. Zero points are unpacked and transposed, scales transposed.

    ``group_size=-1`` (GPTQ's per channel) gives ``group_size=None``. ``g_idx`` (act-order) is
    accepted only when it is the trivial ``k // group_size``: reordered groups are not supported.
    Works on NumPy, CuPy and JAX arrays (the result has the same kind).
    """
    xp = array_module(qweight)
    _check_words(qweight)
    K = 8 * int(qweight.shape[0])
    if g_idx is not None:
        gs = K if group_size == -1 else group_size
        if not bool((_to_host(g_idx) == np.arange(K) // gs).all()):
            raise ValueError("gemvx: g_idx reorders the groups (act-order / desc_act); gemvx needs "
                             "groups of consecutive k: re-quantise without act-order")
    packed = _word_bytes(xp, qweight.T)
    z = _nibbles(xp, qzeros).reshape(int(qzeros.shape[0]), -1)
    z = ((z.astype(np.int32) + int(zero_offset)) & 15).astype(np.uint8).T
    return _finish(xp, packed, scales.T, z, group_size, K)


def from_awq(qweight: Any, qzeros: Any, scales: Any, *, group_size: int) -> QuantizedWeight:
    """Convert an AWQ int4 layer (llm-awq / AutoAWQ "GEMM" format) to a QuantizedWeight.

    AWQ packs along N: ``qweight`` int32 (K, N/8) where nibble j of word [k, i] holds column
    ``8i + (0, 2, 4, 6, 1, 3, 5, 7)[j]``; ``qzeros`` int32 (ceil(K/g), N/8) likewise (holding z);
    ``scales`` (ceil(K/g), N); ``W[k, n] = (q - z) * s``. The repack unpacks the nibbles, undoes the
    interleave, transposes to (N, K) and packs two per byte along K. NumPy, CuPy or JAX arrays.
    """
    xp = array_module(qweight)
    _check_words(qweight)
    K = int(qweight.shape[0])
    inv = [_AWQ_ORDER.index(c) for c in range(8)]  # column 8i + c sits in nibble inv[c]

    def unpack(a: Any) -> Any:
        return _nibbles(xp, a)[..., inv].reshape(int(a.shape[0]), -1)

    return _finish(xp, pack_int4(xp, unpack(qweight).T), scales.T, unpack(qzeros).T, group_size, K)


def _to_host(a: Any) -> np.ndarray:
    return np.asarray(a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else a)
