"""The architecture rules that import-linter (``make test``) cannot state by itself."""

import configparser
import pkgutil
import re
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent


def _contracts():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return cfg


def _lines(text):
    return [line.strip() for line in text.strip().splitlines() if line.strip()]


#: The packages of the project's code.
PACKAGES = ("convbench", "convkernels", "impls", "cudnn_bindings")
#: No module of them is longer than this (lines).
MAX_LINES = 600


def _children(package: str):
    """The names of ``package``'s direct submodules and subpackages."""
    import importlib
    return {m.name for m in pkgutil.iter_modules(importlib.import_module(package).__path__)}


def test_no_file_edits_sys_path():
    """The package is installed (``make setup``): no script or module patches sys.path."""
    pattern = re.compile(r"sys\.path\.(insert|append|extend)|sys\.path\s*[+]?=")
    offenders = []
    for folder in (*PACKAGES, "scripts", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            if path.name == "test_architecture.py":
                continue
            if pattern.search(text):
                offenders.append(str(path.relative_to(ROOT)))
    offenders += [p for p in ("profile_conv3d.py",) if pattern.search((ROOT / p).read_text())]
    assert offenders == []


def test_impls_contract_forbids_every_harness_package_but_the_registry():
    """A new package or module of the harness is forbidden to impls/ as soon as it exists:
    the forbidden list names every child of convbench except the registry (what the
    implementations import, besides the kernel library)."""
    forbidden = set(_lines(_contracts()["importlinter:contract:impls"]["forbidden_modules"]))
    children = {f"convbench.{name}" for name in _children("convbench")}
    assert "convbench.registry" in children
    assert forbidden == children - {"convbench.registry"}


def test_layers_contracts_name_every_child_once():
    """Each layers contract lists every package and module of its container exactly once
    (import-linter's ``exhaustive`` checks the "every"; this the "once")."""
    cfg = _contracts()
    layered = [s for s in cfg.sections() if cfg[s].get("type") == "layers"]
    assert {cfg[s]["containers"].strip() for s in layered} >= {
        "convbench", "convkernels", "convkernels.gpu", "convkernels.cpu"}
    for section in layered:
        layers = _lines(cfg[section]["layers"])
        named = [n.strip("() ") for layer in layers for n in re.split(r"[|:]", layer)]
        assert len(named) == len(set(named)), section
        assert set(named) == _children(cfg[section]["containers"].strip()), section


def test_impls_holds_registrations_only():
    """Each module of impls/ registers one implementation, the one users name, from the
    kernel library: a docstring, imports and one ``register(...)`` call, no code of its
    own (a lambda that binds a parameter is part of the registration)."""
    import ast
    from convbench import registry
    registered = {}
    for path in sorted((ROOT / "impls").glob("*.py")):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        body = [node for node in tree.body if not isinstance(node, (ast.Import, ast.ImportFrom))]
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        calls = [node for node in body if isinstance(node, ast.Expr)
                 and isinstance(node.value, ast.Call)
                 and getattr(node.value.func, "id", "") == "register"]
        assert body == calls and len(calls) == 1, f"{path.name}: not one registration only"
        registered[path.stem] = path
    files = {impl.module_file for impl in registry.all_implementations().values()}
    assert files == {str(p) for p in registered.values()}


def test_every_package_states_its_role_in_one_line():
    """Every package of the harness and of the kernel library opens with a docstring whose
    first line, a sentence, says what the package is for."""
    import importlib
    for root in ("convbench", "convkernels"):
        names = [root] + [m.name for m in pkgutil.walk_packages(
            importlib.import_module(root).__path__, root + ".") if m.ispkg]
        for name in names:
            doc = (importlib.import_module(name).__doc__ or "").strip()
            first = doc.splitlines()[0] if doc else ""
            assert first.endswith(".") and len(first) <= 100, f"{name}: {first!r}"


def test_no_module_is_over_the_line_limit():
    too_long = {}
    for folder in PACKAGES:
        for path in (ROOT / folder).rglob("*.py"):
            lines = path.read_text().count("\n")
            if lines > MAX_LINES:
                too_long[str(path.relative_to(ROOT))] = lines
    assert too_long == {}, f"over {MAX_LINES} lines: {too_long}"


def test_kernel_programs_are_named_by_their_text_alone():
    """Every DaCe program of the kernel library is declared with ``@stable_program``, so
    that the code generated from it does not depend on the module or the line it sits on
    (``convkernels.programs``); a plain ``@dace.program`` would rename its kernels when it
    moves (programs generated as text go through ``program_from_source``, named by a hash
    of their text)."""
    offenders = []
    for folder in ("convkernels", "impls"):
        for path in (ROOT / folder).rglob("*.py"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.match(r"\s*@dace\.(program|method)\b", line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}")
    assert offenders == []


def test_the_harness_layer_model_is_what_the_kernels_read():
    """The kernel library types a layer by the protocol of what it reads
    (``convkernels.layer.Layer``); the harness's layer model provides all of it."""
    from convbench.layersets.layer import Layer
    from convkernels.layer import Layer as KernelLayer
    assert isinstance(Layer("l", 2, 3, 4, 5, 6, 7, 3, 3, 3, pad=1), KernelLayer)


def test_no_import_circles():
    """No module of convbench, convkernels, impls or cudnn_bindings reaches itself through imports,
    counting the imports inside functions, between modules and between convbench's
    top-level modules and packages alike (so a circle through a package's submodules
    counts too)."""
    import grimp
    graph = grimp.build_graph(*PACKAGES)

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
