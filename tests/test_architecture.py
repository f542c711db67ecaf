"""The architecture rules that import-linter (``make test``) cannot state by itself."""

import configparser
import pkgutil
import re
from pathlib import Path

import convbench

ROOT = Path(__file__).resolve().parent.parent


def _contracts():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return cfg


def _lines(text):
    return [line.strip() for line in text.strip().splitlines() if line.strip()]


def test_no_file_edits_sys_path():
    """The package is installed (``make setup``): no script or module patches sys.path."""
    pattern = re.compile(r"sys\.path\.(insert|append|extend)|sys\.path\s*[+]?=")
    offenders = []
    for folder in ("convbench", "scripts", "impls", "cudnn_bindings", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            if path.name == "test_architecture.py":
                continue
            if pattern.search(text):
                offenders.append(str(path.relative_to(ROOT)))
    offenders += [p for p in ("profile_conv3d.py",) if pattern.search((ROOT / p).read_text())]
    assert offenders == []


def test_impls_contract_forbids_every_harness_module_but_the_registry():
    """A new harness module is forbidden to impls/ as soon as it exists: the forbidden
    list must name every module of convbench except the registry, the DaCe library
    environments (MKL, cuBLAS) that a program's library nodes use, the CPU's vector
    ISA that sizes the CPU kernels' tiles, and the Winograd transforms (numpy only) that
    the Winograd kernels will generate their code from."""
    forbidden = set(_lines(_contracts()["importlinter:contract:impls"]["forbidden_modules"]))
    modules = {f"convbench.{m.name}" for m in pkgutil.iter_modules(convbench.__path__)}
    allowed = {"convbench.registry", "convbench.environments", "convbench.isa",
               "convbench.winograd"}
    assert allowed <= modules
    assert forbidden == modules - allowed


def test_layers_contract_names_every_module_once():
    layers = _lines(_contracts()["importlinter:contract:layers"]["layers"])
    named = [n.strip("() ") for layer in layers for n in re.split(r"[|:]", layer)]
    modules = {m.name for m in pkgutil.iter_modules(convbench.__path__)}
    assert len(named) == len(set(named))
    assert set(named) >= modules


def test_no_import_circles():
    """No module of convbench, impls or cudnn_bindings reaches itself through imports,
    counting the imports inside functions, between modules and between convbench's
    top-level modules and packages alike (so a circle through a package's submodules
    counts too)."""
    import grimp
    graph = grimp.build_graph("convbench", "impls", "cudnn_bindings")

    def unit(module):  # convbench.campaign.plan -> convbench.campaign
        parts = module.split(".")
        return ".".join(parts[:2]) if len(parts) > 1 else module

    edges = {}
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            for a, b in ((module, imported), (unit(module), unit(imported))):
                if a != b:
                    edges.setdefault(a, set()).add(b)
    circles, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"
    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert circles == [], "import circles: " + "; ".join(" -> ".join(c) for c in circles)
