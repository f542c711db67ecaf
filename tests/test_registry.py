"""The implementation registry and the --list output."""

import dataclasses
from pathlib import Path

import pytest

from convbench import registry
from convbench.base.errors import UsageError
from convkernels.layouts import Layout, Pass
from convbench.registry import Implementation, Param


def test_first_two_implementations():
    impls = registry.all_implementations()
    ig, dc = impls["implicitGemm"], impls["directConvNCDHW"]
    assert (ig.layout, ig.pass_, ig.targets) == (Layout.NDHWC, Pass.FWD, ("cpu", "gpu"))
    assert (dc.layout, dc.pass_, dc.targets) == (Layout.NCDHW, Pass.FWD, ("cpu", "gpu"))
    assert ig.unsupported_reason(None, {}) is None
    assert any(f.endswith("impls/implicit_gemm.py") for f in ig.source_files())


#: Registry names users type (issue 3) and the module that defines each.
VARIANTS = {
    "implicitGemm": "implicit_gemm", "implicitGemmTiledonly": "implicit_gemm_tiledonly",
    "implicitGemmWarpTiled": "implicit_gemm_warptiled", "implicitGemmNCDHW": "implicit_gemm_ncdhw",
    "implicitGemmsplitK": "implicit_gemm_splitk", "directConvNCDHW": "direct_conv_ncdhw",
    "directConvNCDHWnobuffer": "direct_conv_ncdhw_nobuffer",
    "directConvNCDHWmerged": "direct_conv_ncdhw_merged",
    "directConvNCDHWtileIC": "direct_conv_ncdhw_tileic", "im2colGemm": "im2col_gemm",
}


def test_every_variant_is_registered_for_both_targets():
    impls = registry.all_implementations()
    assert set(VARIANTS) <= set(impls)
    for name, module in VARIANTS.items():
        impl = impls[name]
        assert impl.targets == ("cpu", "gpu"), name
        assert impl.pass_ == Pass.FWD
        source = (Path(__file__).resolve().parent.parent / "impls" / f"{module}.py").read_text()
        assert f'name="{name}"' in source, (name, module)
        params = impl.resolve_params()  # the defaults are valid together
        assert set(params) == {p.name for p in impl.params}


def _defaults():
    from cases import ODD, Case
    return [Case(name, ODD["deep_s2"], "odd") for name in registry.defaults("cli").values()]


@pytest.mark.prebuild(*_defaults())  # the fast tier's builds on its odd layer
@pytest.mark.parametrize("pass_", list(Pass), ids=str)
def test_default_implementations(pass_, write_csv, cachedir, capsys):
    """Per pass, the CLI runs its default when no implementation is named: a registered
    implementation of that pass, for both targets, and the one that declares the role "cli"."""
    from cases import ODD
    from convbench.commands import profile_conv3d as cli
    name = registry.default("cli", pass_)
    impl = registry.get(name)
    assert impl.pass_ == pass_ and impl.targets == ("cpu", "gpu")
    layer = ODD["deep_s2"]
    path = write_csv("layer,batch,in_channels,out_channels,in_d,in_h,in_w,k_d,k_h,k_w,stride,pad\n"
                     f"{layer.name},{layer.batch},{layer.in_channels},{layer.out_channels},"
                     f"{layer.in_d},{layer.in_h},{layer.in_w},3,3,3,{layer.stride},{layer.pad}\n")
    assert cli.main(["--pass", str(pass_), "--verify", "--device", "cpu", "--paramscsv",
                     str(path), "--cachedir", str(cachedir), "--loadprecompiled"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{name} ({pass_}, {impl.layout})") and "PASS" in out


TABLE_BEGIN = "<!-- begin: convbench list --markdown -->"
TABLE_END = "<!-- end: convbench list --markdown -->"


def test_the_implementation_table_is_the_registry():
    """docs/implementations.md holds ``convbench list --markdown`` as it prints today; a
    registered implementation missing from it, or a changed summary, fails here."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "implementations.md").read_text()
    assert TABLE_BEGIN in doc and TABLE_END in doc
    table = doc.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0].strip("\n") + "\n"
    assert table == registry.format_markdown(registry.all_implementations()), \
        "regenerate the table: .venv/bin/convbench list --markdown"


def test_each_role_has_one_default_per_pass():
    for role in ("cli", "network", "network-cpu"):
        for pass_, name in registry.defaults(role).items():
            assert registry.get(name).pass_ == pass_
    assert len(registry.members("best-of")) >= 2
    assert registry.default("cli", "fwd") == "implicitGemmNCDHW"
    with pytest.raises(LookupError):
        registry.default("best-of", "fwd")
    with pytest.raises(ValueError):
        registry.members("fastest")


def test_table_based_variants_refuse_int32_overflow():
    from convbench.layersets.layer import Layer
    huge = Layer("huge", 64, 64, 8, 130, 130, 130, 3, 3, 3)  # 9.1e9 input elements
    for name in VARIANTS:
        impl = registry.get(name)
        reason = impl.unsupported_reason(huge, impl.resolve_params())
        if name in ("implicitGemm", "directConvNCDHW", "im2colGemm"):
            continue
        assert reason and "int32" in reason, name


def test_merged_refuses_kernels_whose_taps_overflow_shared_memory():
    from convbench.layersets.layer import Layer
    impl = registry.get("directConvNCDHWmerged")
    params = impl.resolve_params()
    assert impl.unsupported_reason(Layer("k5", 1, 2, 2, 9, 9, 9, 5, 5, 5), params) is None
    reason = impl.unsupported_reason(Layer("k7", 1, 2, 2, 9, 9, 9, 7, 7, 7), params)
    assert reason and "shared memory" in reason


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


def test_parameters_are_resolved_once():
    """resolve_params gives a read-only value that knows its implementation: resolving it
    again returns the same object, it survives pickling (build workers) and JSON, and a
    change makes a new one."""
    import json
    import pickle
    impl = registry.get("implicitGemmNCDHW")
    params = impl.resolve_params({"CTAtileM": 32})
    assert impl.resolve_params(params) is params
    with pytest.raises(TypeError):
        params["CTAtileM"] = 16
    with pytest.raises(TypeError):
        params.update(CTAtileN=16)
    again = pickle.loads(pickle.dumps(params))
    assert again == params and again.implementation == "implicitGemmNCDHW"
    assert json.loads(json.dumps(params))["CTAtileM"] == 32
    other = impl.resolve_params(dict(params, CTAtileM=16))
    assert other["CTAtileM"] == 16 and params["CTAtileM"] == 32
    assert registry.get("implicitGemmWarpTiled").resolve_params(params) is not params
