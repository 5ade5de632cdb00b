"""The package's imports point downward only and never come back round (DESIGN.md, "Layers").

Every module under `asyncrl/` is parsed with `ast` (nothing is imported), and every import counts:
top-level ones, those inside functions, and those under `if TYPE_CHECKING:` (a type-only import
still ties two modules: change one and the other's types change with it). An import names the
module it reaches: `from asyncrl.a import b` is `asyncrl.a.b` when that is a module, else
`asyncrl.a`. Importing a submodule also runs its packages' `__init__`; that is not counted as an
import of the package, or every `__init__` would sit in a circle with the submodules it imports.

`LAYERS` lists the package from the top down (DESIGN.md's table, plus the modules it leaves out);
a module may import its own layer and those below it. Within one layer (a package's own modules,
or `workers/` and `sync/`) anything goes as long as no circle closes.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import asyncrl

ROOT = Path(asyncrl.__file__).parent

LAYERS: tuple[tuple[str, ...], ...] = (
    # The commands.
    ("asyncrl.cli", "asyncrl.api"),
    # What `asyncrl sim` and `asyncrl eval` run: the simulator drives pipelines/ unchanged on
    # modelled workers (so it sits above them, not at DESIGN.md's bottom line); eval runs one
    # rollout worker over held-out rows.
    ("asyncrl.sim", "asyncrl.eval"),
    # One loop per file, and building a run (setup, context, router, run directory, checkpoints).
    ("asyncrl.pipelines",),
    # Where a run's workers live: builds them from workers/ on one machine, processes or Ray.
    ("asyncrl.substrates",),
    ("asyncrl.workers", "asyncrl.sync", "asyncrl.queue"),
    ("asyncrl.rollout", "asyncrl.training"),
    # Checks a config against its data, model files and rewards before anything starts: it may
    # read what lies below, never an engine, a trainer, a worker or a pipeline.
    ("asyncrl.preflight",),
    # Leaf components and services: rewards, data, model loading and a model's named weights,
    # the role protocols every worker implements, metrics/loggers/trace, torch's threads, a
    # device's out-of-memory error as ours, atomic files, run state as JSON + safetensors. Above
    # the pure core, so scheduling/ and algorithms/ cannot reach clocks, threads, files or workers.
    ("asyncrl.rewards", "asyncrl.data", "asyncrl.models", "asyncrl.roles", "asyncrl.telemetry",
     "asyncrl.compute", "asyncrl.oom", "asyncrl.fsutil", "asyncrl.state_io", "asyncrl.user_code", "asyncrl.tools",
     "asyncrl.agents"),
    # The pure core: policies shared by pipelines and the simulator, then tensor functions.
    ("asyncrl.scheduling",),
    ("asyncrl.algorithms",),
    # Messages, configuration (schema and registry names, torch-free) and errors; `asyncrl`
    # itself (its `__init__` checks the torch version).
    ("asyncrl", "asyncrl.types", "asyncrl.config", "asyncrl.errors"),
)
LAYER = {unit: len(LAYERS) - 1 - i for i, units in enumerate(LAYERS) for unit in units}
"""Each unit's height: 0 at the bottom."""

Graph = dict[str, dict[str, str]]
"""module -> {module it imports: "path:line" of the first such import}."""


def unit(module: str) -> str:
    """What `LAYERS` places: "asyncrl.sim.costs" -> "asyncrl.sim"; "asyncrl" stays itself."""
    return ".".join(module.split(".")[:2])


def module_paths(root: Path, package: str) -> dict[str, Path]:
    """Every module of the package under `root`, by dotted name (a package by its `__init__`)."""
    names: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = (package, *path.relative_to(root).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imports(tree: ast.AST, package_here: str) -> Iterator[tuple[str, tuple[str, ...], int]]:
    """(module named, names imported from it, line) for every import statement in `tree`;
    `package_here` is the package that relative imports start from."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, (), node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package_here.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            yield base, tuple(a.name for a in node.names), node.lineno


def import_graph(root: Path, package: str) -> tuple[Graph, list[str]]:
    """Each module's imports of the package's modules, and the imports that name none ("path:line")."""
    modules = module_paths(root, package)
    graph: Graph = {m: {} for m in modules}
    unknown: list[str] = []
    for module, path in modules.items():
        here = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for base, names, line in imports(ast.parse(path.read_text(), str(path)), here):
            if base != package and not base.startswith(package + "."):
                continue
            site = f"{path.relative_to(root.parent)}:{line}"
            targets = [f"{base}.{n}" if f"{base}.{n}" in modules else base for n in names] or [base]
            for target in targets:
                if target not in modules:
                    unknown.append(f"{site} imports {target}, which is no module of {package}")
                elif target != module:
                    graph[module].setdefault(target, site)
    return graph, unknown


def find_cycle(graph: Graph) -> list[str]:
    """One circle of imports as [a, b, ..., a], or [] when there is none (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in graph:
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
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
    return []


def describe(cycle: list[str], graph: Graph) -> str:
    return "\n".join(f"  {a} -> {b}  ({graph[a][b]})" for a, b in zip(cycle, cycle[1:]))


def test_every_import_of_the_package_names_one_of_its_modules() -> None:
    _, unknown = import_graph(ROOT, "asyncrl")
    assert not unknown, "\n".join(unknown)


def test_no_import_circle() -> None:
    graph, _ = import_graph(ROOT, "asyncrl")
    cycle = find_cycle(graph)
    assert not cycle, "modules that import each other round a circle:\n" + describe(cycle, graph)


def test_every_module_has_a_layer() -> None:
    unplaced = sorted({unit(m) for m in module_paths(ROOT, "asyncrl")} - LAYER.keys())
    assert not unplaced, f"place these in LAYERS (tests/test_imports.py, DESIGN.md's layers): {unplaced}"


def test_imports_point_downward() -> None:
    graph, _ = import_graph(ROOT, "asyncrl")
    upward = [f"  {a} (layer {LAYER[unit(a)]}) imports {b} (layer {LAYER[unit(b)]})  ({site})"
              for a, targets in graph.items() for b, site in targets.items()
              if LAYER.get(unit(a), 0) < LAYER.get(unit(b), 0)]
    assert not upward, "imports from a lower layer to a higher one (LAYERS, DESIGN.md):\n" + "\n".join(upward)


def test_the_graph_sees_imports_in_functions_type_checking_and_relative_ones(tmp_path: Path) -> None:
    """A package whose circle closes only through a function-level import and a type-only one,
    and whose relative imports name a subpackage's module and a package's `__init__`."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg.b import g\n    return g\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.sub.c\n")
    (pkg / "sub" / "__init__.py").write_text("from .c import X\n")
    (pkg / "sub" / "c.py").write_text("from .. import a\nfrom . import d\nfrom pkg.nowhere import Y\nX = 1\n")
    (pkg / "sub" / "d.py").write_text("from pkg import sub\n")
    graph, unknown = import_graph(pkg, "pkg")
    assert graph == {"pkg": {}, "pkg.a": {"pkg.b": "pkg/a.py:2"}, "pkg.b": {"pkg.sub.c": "pkg/b.py:3"},
                     "pkg.sub": {"pkg.sub.c": "pkg/sub/__init__.py:1"},
                     "pkg.sub.c": {"pkg.a": "pkg/sub/c.py:1", "pkg.sub.d": "pkg/sub/c.py:2"},
                     "pkg.sub.d": {"pkg.sub": "pkg/sub/d.py:1"}}
    assert unknown == ["pkg/sub/c.py:3 imports pkg.nowhere, which is no module of pkg"]
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]
    del graph["pkg.a"]["pkg.b"]
    assert find_cycle(graph) == ["pkg.sub.c", "pkg.sub.d", "pkg.sub", "pkg.sub.c"]
