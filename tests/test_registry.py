"""The implementation registry and the --list output."""

import dataclasses

import pytest

from convbench import registry
from convbench.errors import UsageError
from convbench.layouts import Layout, Pass
from convbench.registry import Implementation, Param


def test_first_two_implementations():
    impls = registry.all_implementations()
    ig, dc = impls["implicitGemm"], impls["directConvNCDHW"]
    assert (ig.layout, ig.pass_, ig.targets) == (Layout.NDHWC, Pass.FWD, ("cpu", "gpu"))
    assert (dc.layout, dc.pass_, dc.targets) == (Layout.NCDHW, Pass.FWD, ("cpu", "gpu"))
    assert ig.unsupported_reason(None, {}) is None
    assert any(f.endswith("impls/implicit_gemm.py") for f in ig.source_files())


def test_unknown_name_lists_known():
    with pytest.raises(UsageError, match="unknown implementation 'nope'.*implicitGemm"):
        registry.get("nope")


def _toy(**kw):
    base = dict(name="toy", summary="toy", layout="NCDHW", pass_="fwd", algorithm=lambda *a: None,
                schedules={"cpu": lambda *a: None},
                params=(Param("tileM", 64, "rows per tile", check=lambda v: None if v % 8 == 0
                              else "must be a multiple of 8"),
                        Param("splitK", 1, "K splits")),
                supports=lambda layer, params: None if layer.stride == 1 else "needs stride 1",
                constraints="stride 1")
    base.update(kw)
    return Implementation(**base)


def test_params():
    impl = _toy()
    assert impl.resolve_params() == {"tileM": 64, "splitK": 1}
    assert impl.resolve_params({"tileM": "32"}) == {"tileM": 32, "splitK": 1}
    for overrides, words in [({"tileN": "8"}, "has no parameter 'tileN'"),
                             ({"tileM": "x"}, "must be an integer"),
                             ({"tileM": "12"}, "multiple of 8"),
                             ({"splitK": "0"}, ">= 1")]:
        with pytest.raises(UsageError, match=words):
            impl.resolve_params(overrides)
    assert registry.parse_param_overrides(["a=1", " b = 2 "]) == {"a": "1", "b": "2"}
    for bad in ["a", "=1", "a="]:
        with pytest.raises(UsageError, match="NAME=VALUE"):
            registry.parse_param_overrides([bad])


def test_bad_declarations():
    with pytest.raises(ValueError, match="unknown targets"):
        _toy(schedules={"tpu": lambda *a: None})
    with pytest.raises(ValueError):
        _toy(layout="NHWC")
    with pytest.raises(ValueError, match="duplicated parameter"):
        _toy(params=(Param("a", 1), Param("a", 2)))
    with pytest.raises(ValueError, match="constraints"):
        _toy(constraints="")


def test_register_twice(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry.all_implementations()))
    toy = registry.register(_toy())
    assert registry.register(toy) is toy  # idempotent for the same object
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(dataclasses.replace(toy, summary="other"))


def test_listing():
    text = registry.format_listing({"toy": _toy()})
    assert "toy" in text and "pass: fwd" in text and "layout: NCDHW" in text
    assert "supports: stride 1" in text
    assert "targets: cpu" in text and "tileM=64" in text and "splitK=1" in text
    full = registry.format_listing(registry.all_implementations())
    assert "implicitGemm" in full and "directConvNCDHW" in full
