"""A simulated GPU for CPU tests of the timing code: a NumPy-backed stand-in for the parts of
CuPy that gemvx.tune and benchmarks/bench.py use, with a clock.

Work runs on NumPy at once; what it "costs" is simulated: code under test (or the test's fake
kernels) adds milliseconds to the current stream's clock with :func:`spend`. Inside a stream
capture the costs are recorded instead, and every replay of the captured graph adds their sum.
Events read the clock, so the tuner's and the benchmark's arithmetic can be checked exactly.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np


class SimStream:
    current: SimStream | None = None

    def __init__(self, non_blocking: bool = False):
        self.t, self.ops, self.prev = 0.0, None, []

    def __enter__(self) -> SimStream:
        self.prev.append(SimStream.current)
        SimStream.current = self
        return self

    def __exit__(self, *exc: Any) -> None:
        SimStream.current = self.prev.pop()

    def synchronize(self) -> None:
        pass

    def begin_capture(self) -> None:
        self.ops = []

    def end_capture(self) -> Any:
        ops, self.ops = self.ops, None
        return SimGraph(ops)


class SimGraph:
    def __init__(self, ops: list[float]):
        self.ops = ops

    def launch(self, s: SimStream | None = None) -> None:
        (s or SimStream.current).t += sum(self.ops)


def current() -> SimStream:
    return SimStream.current or DEFAULT


def capturing() -> bool:
    return current().ops is not None


def spend(ms: float) -> None:
    """A kernel of ``ms`` simulated milliseconds on the current stream (recorded when capturing)."""
    s = current()
    if s.ops is not None:
        s.ops.append(ms)
    else:
        s.t += ms


DEFAULT = SimStream()


class SimEvent:
    def __init__(self, *a: Any, **k: Any):
        self.t = 0.0

    def record(self, s: SimStream | None = None) -> None:
        self.t = (s or current()).t

    def synchronize(self) -> None:
        pass


class SimDevice:
    id = 0

    def __init__(self, i: int = 0):
        pass

    def __enter__(self) -> SimDevice:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


class SimRandomState:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def standard_normal(self, shape: Any, dtype: Any = np.float64) -> np.ndarray:
        return self.rng.standard_normal(shape, dtype=dtype)

    def randint(self, low: int, high: int, size: Any, dtype: Any = np.int64) -> np.ndarray:
        return self.rng.integers(low, high, size, dtype=dtype)

    def uniform(self, low: float, high: float, size: Any) -> np.ndarray:
        return self.rng.uniform(low, high, size)


def sim_cupy(props: dict | None = None, free_bytes: int = 8 << 30) -> Any:
    """The CuPy stand-in. ``props``: what cupy.cuda.runtime.getDeviceProperties returns."""
    props = props or {"name": b"Sim GPU", "major": 9, "minor": 0, "multiProcessorCount": 4,
                      "l2CacheSize": 64 << 10}
    runtime = SimpleNamespace(
        getDeviceCount=lambda: 1, getDeviceProperties=lambda i: dict(props),
        memGetInfo=lambda: (free_bytes, 2 * free_bytes), driverGetVersion=lambda: 13000,
        runtimeGetVersion=lambda: 13000)
    pool = SimpleNamespace(free_all_blocks=lambda: None)
    return SimpleNamespace(
        __version__="sim", ndarray=np.ndarray,
        float16=np.float16, float32=np.float32, float64=np.float64,
        int8=np.int8, int16=np.int16, int32=np.int32, uint8=np.uint8, uint16=np.uint16, uint32=np.uint32,
        empty=np.empty, zeros=np.zeros, linalg=np.linalg, asarray=np.asarray, asnumpy=np.asarray,
        random=SimpleNamespace(RandomState=SimRandomState),
        get_default_memory_pool=lambda: pool,
        cuda=SimpleNamespace(Stream=SimStream, Event=SimEvent, Device=SimDevice, runtime=runtime,
                             get_elapsed_time=lambda a, b: b.t - a.t,
                             get_current_stream=current))
