"""The package's imports point down: no upward import, no cycle, no private name taken from another module.

Every module's docstring names its layer (``Layer N: ...``).  The walk reads each module's source,
function-level imports included, so an import hidden in a function counts like one at the top; and each
imported name must exist in the module it comes from (an import that only runs on a GPU path is checked
here too).
"""

import ast
import importlib
import pathlib
import re

import pytest

import tcgnn_py

ROOT = pathlib.Path(tcgnn_py.__file__).parent
EXEMPT = {"tcgnn_py", "tcgnn_py.bench.__main__", "tcgnn_py.distributed.__main__"}  # entry points: the top


def _modules():
    mods = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        tree = ast.parse(path.read_text())
        m = re.match(r"Layer (\d)\b", ast.get_docstring(tree) or "")
        mods[name] = (path, tree, int(m.group(1)) if m else None)
    return mods


MODULES = _modules()


def _imports(name):
    """``(target module, imported name or None, line)`` of every tcgnn_py import in ``name``'s source."""
    path, tree, _ = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "tcgnn_py" or target.startswith("tcgnn_py."):
                out += [(target, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [(alias.name, None, node.lineno) for alias in node.names if alias.name.startswith("tcgnn_py")]
    return out


def _edges(name):
    """Modules ``name`` imports (a name that is a submodule counts as that module)."""
    deps = set()
    for target, alias, _ in _imports(name):
        sub = f"{target}.{alias}" if alias else None
        deps.add(sub if sub in MODULES else target)
    deps.discard(name)
    return {d for d in deps if d in MODULES}


def test_every_module_names_its_layer():
    assert [n for n, (_, _, layer) in MODULES.items() if layer is None and n not in EXEMPT] == []


def test_imports_point_down():
    upward = []
    for name, (_, _, layer) in MODULES.items():
        if name in EXEMPT:
            continue
        for dep in _edges(name):
            if name.startswith(dep + "."):
                continue  # a package's __init__ runs before its modules: importing a sibling through it is down
            dep_layer = MODULES[dep][2]
            if dep_layer is not None and dep_layer > layer:
                upward.append(f"{name} (layer {layer}) imports {dep} (layer {dep_layer})")
    assert upward == []


def test_no_import_cycles():
    graph = {n: {d for d in _edges(n) if not n.startswith(d + ".")} for n in MODULES if n not in EXEMPT}
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                cycles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert cycles == []


def test_no_private_names_across_modules():
    private = [f"{name}:{line} imports {alias} from {target}" for name in MODULES
               for target, alias, line in _imports(name)
               if alias and alias.startswith("_") and not alias.startswith("__") and f"{target}.{alias}" not in MODULES]
    assert private == []


@pytest.mark.parametrize("name", sorted(n for n in MODULES if not n.endswith("__main__")))
def test_imported_names_exist(name):
    """Every ``from tcgnn_py... import x`` names something that module has (GPU-only paths included)."""
    missing = []
    for target, alias, line in _imports(name):
        if alias is None or alias == "*" or f"{target}.{alias}" in MODULES:
            continue
        if not hasattr(importlib.import_module(target), alias):
            missing.append(f"{name}:{line} imports {alias!r} from {target}")
    assert missing == []


def test_the_walk_sees_function_level_imports():
    """Not vacuous: the walk finds a module imported as a name, and an import made inside a function."""
    assert ("tcgnn_py", "_reference") in {(t, a) for t, a, _ in _imports("tcgnn_py.products._dispatch")}
    assert "tcgnn_py._reference" in _edges("tcgnn_py.products._dispatch")
    assert ("tcgnn_py.kernels.registry", "stop_background_compiles") in {  # inside spmd() and init()
        (t, a) for t, a, _ in _imports("tcgnn_py.distributed._context")}


SCRIPTS = sorted(p for d in ("tools", "asv_bench", "examples") for p in (ROOT.parent / d).rglob("*.py"))


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_scripts_use_public_names_only(path):
    """Tools, benchmarks and examples reach the package through public names, so a refactor cannot break them."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tcgnn_py"):
            parts = node.module.split(".") + [a.name for a in node.names]
            bad += [f"line {node.lineno}: from {node.module} import {a.name}" for a in node.names
                    if any(p.startswith("_") and not p.startswith("__") for p in parts)]
        elif isinstance(node, ast.Import):
            bad += [f"line {node.lineno}: import {a.name}" for a in node.names
                    if a.name.startswith("tcgnn_py") and any(p.startswith("_") for p in a.name.split("."))]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                bad.append(f"line {node.lineno}: .{node.attr}")
    assert bad == []


def test_packages_are_entered_by_their_front_doors():
    """A module takes another package's names from that package (its ``__init__``), never from a private module
    inside it (the package root's own private modules are everyone's layer-0 helpers)."""
    bad = []
    for name in MODULES:
        for target, alias, line in _imports(name):
            full = f"{target}.{alias}" if alias and f"{target}.{alias}" in MODULES else target
            parts = full.split(".")
            for i in range(2, len(parts)):
                owner = ".".join(parts[:i])
                if parts[i].startswith("_") and not parts[i].startswith("__"):
                    if not (name == owner or name.startswith(owner + ".")):
                        bad.append(f"{name}:{line} imports {full}")
                    break
    assert bad == []


def test_the_contributors_layer_table_lists_every_module():
    """docs/contributing.md's layer table follows the code: each private module of the package root and each
    module of ``kernels/``, ``products/``, ``tiles/`` and ``orders/`` by name, the other packages by ``name/``,
    each in the row of its layer."""
    text = (ROOT.parent / "docs" / "contributing.md").read_text()
    rows = {int(m.group(1)): m.group(2) for m in re.finditer(r"^\| (\d) \| (.*) \|$", text, flags=re.M)}
    missing = []
    for name, (_, _, layer) in MODULES.items():
        parts = name.split(".")
        if layer is None or len(parts) < 2:
            continue
        if parts[1] == "kernels":
            want = "kernels/" if len(parts) == 2 else parts[2]
        elif len(parts) == 2 and parts[1].startswith("_"):
            want = parts[1]
        else:
            want = parts[1] + "/"
        if f"`{want}`" not in rows.get(layer, ""):
            missing.append(f"{name} (layer {layer}) as `{want}`")
    assert missing == []


def test_the_kernels_docstring_lists_every_family():
    from tcgnn_py.kernels import registry

    doc = importlib.import_module("tcgnn_py.kernels").__doc__
    own = [f for f in registry.families() if f != "baseline"]  # the benchmarks' own family is theirs to document
    assert [f for f in own if f'``"{f}"``' not in doc] == []


#: nn modules that still call kernels themselves (the cuBLAS wrapper, a library's handle rather than a kernel
#: family); every other nn module goes through the engine's modules.
NN_KERNEL_IMPORTS = {"tcgnn_py.nn._layers": {"tcgnn_py.kernels.blas"}}


def test_nn_reaches_kernels_only_through_the_engine():
    """Graph attention's launches, work units and weights are the engine's (``products.attention``), not nn's."""
    got = {}
    for name in MODULES:
        if name.startswith("tcgnn_py.nn"):
            deps = {d for d in _edges(name) if d.startswith("tcgnn_py.kernels")}
            if deps:
                got[name] = deps
    assert got == NN_KERNEL_IMPORTS


ENGINE = "tcgnn_py.products"
FAMILIES = "tcgnn_py.products.families"


def test_the_engine_is_one_package_with_a_family_per_module():
    assert {n for n in MODULES if n.startswith(FAMILIES + ".")} == {
        f"{FAMILIES}.{f}" for f in ("tf32", "core", "vec", "half", "sparse", "attention", "dense", "pointwise",
                                     "optimizer")}


def test_tiled_matrix_and_nn_enter_the_engine_by_its_front_door():
    """``_tiled``, ``nn`` and ``distributed`` import the engine's package, never a module inside it."""
    inside = {name: sorted(d for d in _edges(name) if d.startswith(ENGINE + "."))
              for name in MODULES if not name.startswith(ENGINE) and name != "tcgnn_py"}
    assert {name: deps for name, deps in inside.items() if deps} == {}
    assert ENGINE in _edges("tcgnn_py._tiled")


def test_a_family_imports_no_sibling_family():
    bad = {name: sorted(d for d in _edges(name) if d.startswith(FAMILIES + ".") and d != name)
           for name in MODULES if name.startswith(FAMILIES + ".")}
    assert {name: deps for name, deps in bad.items() if deps} == {}


def test_the_autotuner_and_the_shared_modules_import_no_family():
    """Only the front door and the package's names reach the families: what they share lives below them."""
    reach = {name: sorted(d for d in _edges(name) if d.startswith(FAMILIES))
             for name in MODULES if name.startswith(ENGINE + "._") and name != ENGINE + "._dispatch"}
    assert {name: deps for name, deps in reach.items() if deps} == {}


def test_one_module_drops_a_caches_oldest_entry():
    """Every bounded cache keeps its entries by one rule, ``_cache.keep``: no module evicts a dict's oldest entry
    itself (``del d[next(iter(d))]``, ``d.pop(next(iter(d)))``)."""
    evicting = re.compile(r"(del \w+\[next\(iter\(|\.pop\(next\(iter\()")
    found = [f"{name}:{i}" for name, (path, _, _) in MODULES.items() if name != "tcgnn_py._cache"
             for i, line in enumerate(path.read_text().splitlines(), 1) if evicting.search(line)]
    assert found == []
    assert evicting.search((ROOT / "_cache.py").read_text())  # (not vacuous: the rule's own line matches)


def test_no_undefined_names_on_any_path():
    """A name that is not defined fails here, without a GPU, even on a path only a GPU runs (pyflakes reads
    every function whether or not a test calls it)."""
    pytest.importorskip("pyflakes", reason="pyflakes comes with the test extra")
    from pyflakes import api, messages, reporter

    class Collect(reporter.Reporter):
        def __init__(self):
            self.found = []

        def flake(self, message):
            if isinstance(message, (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)):
                self.found.append(str(message))

        def syntaxError(self, *args):
            self.found.append(f"syntax error: {args}")

        def unexpectedError(self, *args):
            self.found.append(f"unexpected: {args}")

    r = Collect()
    api.checkRecursive([str(ROOT)], r)
    assert r.found == []
