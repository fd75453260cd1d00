"""The import graph keeps the architecture: no cycles, arrows one way, no private names shared.

Every ``.py`` of the five packages is parsed (not imported) and every import in it,
at module level or inside a function, is an arrow. The layers, from the top:

    commands (specbatch: the CLI and the Python API)  ->  calibrate  ->  sim core  ->  {policies, workloads}

An arrow may point down or stay inside its layer, never up; ``policies`` and
``workloads`` import neither ``sim`` nor ``calibrate``; nothing in the sim core,
``policies`` or ``workloads`` imports torch (importing ``sim`` stays cheap, and a GPU
box with only torch can run ``calibrate``). No two files import each other, however
long the way round, no two parts of ``sim`` (a folder, or a module directly in it) import each
other, and a name starting with one underscore is private to its module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("specbatch", "sim", "calibrate", "policies", "workloads")
LAYERS = {"commands": 3, "calibrate": 2, "core": 1, "policies": 0, "workloads": 0}
TORCH_FREE = ("core", "policies", "workloads")

# Private names imported across modules: none. A new entry needs a reason, not a habit.
# Each entry: (importing module, imported module, name).
KNOWN_PRIVATE_IMPORTS: set[tuple[str, str, str]] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, ast.Module]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = ast.parse(path.read_text(), filename=str(path))
    return found


MODULES = _modules()


def _is_package(name: str) -> bool:
    return (ROOT / Path(*name.split(".")) / "__init__.py").is_file()


def _resolve(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if not _is_package(importer):
        base = base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(importer: str, tree: ast.Module) -> list[tuple[str, str | None]]:
    """(imported module, name or None) for every import in ``tree``; a ``from package import
    submodule`` names the submodule itself."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(importer, node)
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                out.append((sub, None) if sub in MODULES else (module, alias.name))
    return out


def layer(module: str) -> str | None:
    top = module.split(".")[0]
    if top == "specbatch":
        return "commands"
    if top == "sim":
        return "core"
    return top if top in LAYERS else None


def _graph() -> dict[str, set[str]]:
    graph = {name: set() for name in MODULES}
    for name, tree in MODULES.items():
        for target, _ in imports(name, tree):
            if target in MODULES and target != name:
                graph[name].add(target)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` if it has any (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(graph):
        if root in state:
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_the_walk_sees_the_whole_code_base():
    assert {"sim.simulate", "specbatch.commands.cli", "calibrate.replay", "policies.base", "workloads.trace"} <= set(MODULES)
    assert ("calibrate.model", "Transformer") in imports("calibrate.replay", MODULES["calibrate.replay"])


def test_no_file_imports_itself_the_long_way_round():
    graph = {name: {t for t in targets if not _is_package(t)} for name, targets in _graph().items()}
    # A package's __init__ re-exports its modules; an arrow to it is an arrow to the package, so
    # files are checked among themselves and packages (below) among themselves.
    cycle = _cycle(graph)
    assert cycle is None, "import cycle between files: " + " -> ".join(cycle)


def sim_part(module: str) -> str | None:
    """The part of ``sim`` a module belongs to: its folder (``sim.serving``) or, directly in ``sim``,
    the module itself (``sim.jit``); None outside ``sim`` and for ``sim`` itself."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "sim" and len(parts) > 1 else None


def two_way_pairs(arrows: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """The pairs (a, b), a < b, with an arrow each way."""
    return sorted((a, b) for a, b in arrows if a < b and (b, a) in arrows)


def test_no_two_parts_of_sim_import_each_other():
    arrows = set()
    for name, tree in MODULES.items():
        source = sim_part(name)
        for target, _ in imports(name, tree):
            dest = sim_part(target)
            if source and dest and dest != source:
                arrows.add((source, dest))
    pairs = two_way_pairs(arrows)
    assert not pairs, "parts of sim that import each other: " + ", ".join(f"{a} <-> {b}" for a, b in pairs)


def test_no_cycle_between_layers_and_every_arrow_points_down():
    wrong = []
    for name, tree in MODULES.items():
        source = layer(name)
        for target, _ in imports(name, tree):
            dest = layer(target)
            if dest is None or dest == source:
                continue
            if LAYERS[dest] >= LAYERS[source]:
                wrong.append(f"{name} ({source}) imports {target} ({dest})")
    assert not wrong, "arrows against the layering:\n" + "\n".join(wrong)


def test_the_core_policies_and_workloads_never_import_torch():
    wrong = [f"{name} imports {target}" for name, tree in MODULES.items() if layer(name) in TORCH_FREE
             for target, _ in imports(name, tree) if target.split(".")[0] == "torch"]
    assert not wrong, "\n".join(wrong)


def test_no_private_name_is_imported_from_another_module():
    found = set()
    for name, tree in MODULES.items():
        for target, imported in imports(name, tree):
            if imported and imported.startswith("_") and not imported.startswith("__") and target in MODULES:
                found.add((name, target, imported))
    new = sorted(found - KNOWN_PRIVATE_IMPORTS)
    assert not new, "private names imported across modules:\n" + "\n".join(map(str, new))
    gone = sorted(KNOWN_PRIVATE_IMPORTS - found)
    assert not gone, "fixed, so remove from KNOWN_PRIVATE_IMPORTS:\n" + "\n".join(map(str, gone))


def test_the_checks_catch_what_they_are_for():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert two_way_pairs({("x", "y"), ("y", "x"), ("x", "z")}) == [("x", "y")]
    assert sim_part("sim.serving.loop") == "sim.serving" and sim_part("sim.jit") == "sim.jit"
    assert sim_part("sim") is None and sim_part("policies.base") is None
    assert layer("specbatch.commands.sweep.spec") == "commands" and layer("numpy") is None
    assert layer("sim.simulate") == "core" and layer("calibrate.replay") == "calibrate"
    tree = ast.parse("from sim.config import _flatten\nimport torch\n")
    assert ("sim.config", "_flatten") in imports("policies.x", tree) and ("torch", None) in imports("policies.x", tree)


def test_simpy_is_used_in_one_place():
    users = sorted({name for name, tree in MODULES.items() for target, _ in imports(name, tree)
                    if target.split(".")[0] == "simpy"})
    assert users == ["sim.serving.clock"]
