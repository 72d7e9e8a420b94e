"""CPU tests of benchmarks/fixed_cost.py's parts that need no GPU: the implementation names, the
command line and the line fit."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import fixed_cost  # noqa: E402


@pytest.mark.parametrize("text, want", [
    ("read", ("read", None, None)),
    ("dense", ("dense", None, None)),
    ("int8c-float16", ("int8c", "float16", None)),
    ("int8c-bfloat16/122/1", ("int8c", "bfloat16", (122, 1))),
])
def test_parse_impl(text, want):
    assert fixed_cost.parse_impl(text) == want
    assert fixed_cost._name(want) == text


@pytest.mark.parametrize("text", ["int8c", "int8c-float32", "int4c-float16", "int8c-float16/122",
                                  "int8c-float16/a/1", "Read", ""])
def test_parse_impl_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        fixed_cost.parse_impl(text)


def test_fit_recovers_a_line():
    a, bw = 2.37, 4321.0  # µs, GB/s
    pts = [(b, a + b / (bw * 1e3)) for b in (1 << 24, 3 << 24, 7 << 24, 10 << 24)]
    f = fixed_cost.fit(pts)
    assert f["a_us"] == pytest.approx(a, rel=1e-9)
    assert f["bw_gbps"] == pytest.approx(bw, rel=1e-9)
    assert f["max_resid_us"] < 1e-9


def test_fit_reports_the_largest_residual():
    pts = [(1 << 24, 6.0), (2 << 24, 10.5), (3 << 24, 14.0)]  # the middle point off the line by 0.33
    assert fixed_cost.fit(pts)["max_resid_us"] == pytest.approx(1 / 3, rel=1e-9)


def test_fit_needs_two_sizes():
    with pytest.raises(ValueError, match="two sizes"):
        fixed_cost.fit([(1 << 24, 6.0), (1 << 24, 6.1)])


def test_parse_args():
    args = fixed_cost.parse_args(["--M", "1024", "--K", "2048,4096", "--impls", "read,int8c-bfloat16/118/1"])
    assert (args.M, args.K) == (1024, [2048, 4096])
    assert args.impls == [("read", None, None), ("int8c", "bfloat16", (118, 1))]
    default = fixed_cost.parse_args([])
    assert len(set(default.K)) >= 2 and all(k % 2 == 0 for k in default.K)


@pytest.mark.parametrize("argv", [["--K", "4096"], ["--K", "4096,4096"], ["--K", "4095,4096"],
                                  ["--K", "4096,x"], ["--M", "0"], ["--impls", "read,int8c-fp8"]])
def test_parse_args_rejects(argv, capsys):
    with pytest.raises(SystemExit):
        fixed_cost.parse_args(argv)
    assert capsys.readouterr().err
