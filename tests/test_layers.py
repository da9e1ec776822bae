"""The house's layers hold: every import points down (or sideways), and no two
modules import each other, directly or round a circle.

Read from the source with ``ast`` (nothing is imported), every ``import``
counted, also those inside functions: a lazy import is still a dependency.
The layers, bottom to top, are those of docs/ARCHITECTURE.md; a module not
listed here fails the test, so that a new file is placed on purpose.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (level, module prefix), the most specific prefix wins. A module may import
#: modules of its own level or below.
LAYERS = [
    (0, "minidist.backend"), (0, "minidist.atomic_file"), (0, "minidist.alpha_beta"),
    (0, "minidist.lesson"), (0, "minidist.model_gap"), (0, "minidist.units"),
    (0, "minidist.narration"),
    (0, "minidist.topology"),  # a cluster's shape: nodes, the links inside and between them
    (1, "minidist.tensor"), (1, "minidist.trace"), (1, "minidist.runtime"),
    (1, "minidist.split_backward"),  # the backward in two halves, I then W: the autograd's own
    (1, "minidist.virtual_clock"), (1, "minidist.lesson_timing"),
    (2, "minidist.nn"), (2, "minidist.optim"), (2, "minidist.data"), (2, "minidist.memory"),
    (2, "minidist.flops"),  # a step's flops counted, the measured GEMM peak, MFU
    (2, "minidist.profile"),  # where a traced run's time went: reads traces alone
    (2, "minidist.amp"),
    (2, "minidist.models"),  # whole models of nn's layers (the GPT); the strategies above split them
    (3, "minidist.distributed.transport"),
    (4, "minidist.distributed"),  # the torch.distributed-shaped face: groups, p2p, world
    (5, "minidist.distributed.collectives"),
    (6, "minidist.distributed.simulator"),
    (6, "minidist.distributed.tensor"),  # DTensor: layouts on a mesh, redistribute by collectives
    (7, "minidist.distributed.checkpoint"),  # DCP: every rank saves its shards, any layout loads them
    (6, "minidist.costmodel"),
    (7, "minidist.parallel"), (7, "minidist.bench"), (7, "minidist.experiments"),
    (7, "minidist.train"), (7, "minidist.train_gpt"), (7, "minidist.examples"), (7, "minidist.search"),
    (7, "minidist.exercises"),
    (8, "viz"),
    (9, "minidist.profile_command"),  # `minidist profile TRACE`
    (9, "minidist.cli"), (9, "minidist.commands"), (9, "minidist.exercise_command"),
    (9, "minidist.run_script"), (9, "minidist.run_elastic"),
    (1, "minidist"),  # the package's __init__ alone: the Tensor and friends
]

#: (importer, imported prefix): the package faces re-export from above
#: them, which is what `import minidist.distributed as dist` (the collectives,
#: the simulator), `minidist.launch` and `minidist.nn.SyncBatchNorm` (imported
#: lazily) promise.
ALLOWED_UP = {
    ("minidist.distributed", "minidist.distributed.collectives"),
    ("minidist.distributed", "minidist.distributed.simulator"),
    ("minidist", "minidist.distributed"),
}


def _allowed(module: str, other: str) -> bool:
    return any(module == importer and (other == prefix or other.startswith(prefix + "."))
               for importer, prefix in ALLOWED_UP)


def _modules() -> dict[str, Path]:
    found = {}
    for base in ("minidist", "viz"):
        for path in (ROOT / base).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _level(module: str) -> int:
    best = None
    for level, prefix in LAYERS:
        if module == prefix or (module.startswith(prefix + ".") and prefix != "minidist"):
            if best is None or len(prefix) > len(best[1]):
                best = (level, prefix)
    assert best is not None, f"{module} is on no layer: add it to LAYERS in {__file__}"
    return best[0]


def _package(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rsplit(".", 1)[0]


def _imports(module: str, path: Path, modules: dict) -> set[str]:
    """The project modules ``module`` imports (the most specific one named)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _package(module, path).split(".")
                package = package[:len(package) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                     for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {module: _imports(module, path, modules) for module, path in modules.items()}


def test_every_import_points_down():
    upward = []
    for module, imported in _graph().items():
        for other in imported:
            if _level(other) > _level(module) and not _allowed(module, other):
                upward.append(f"{module} (level {_level(module)}) imports {other} "
                              f"(level {_level(other)})")
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(sorted(upward))


def test_no_import_circles():
    graph = _graph()
    circles = _circles(graph)
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c + [c[0]]) for c in circles)


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, on_stack, stack, result = {}, {}, set(), [], []
    counter = [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return result


def test_the_checker_sees_a_circle_and_an_upward_import():
    """The test can fail: a made-up graph with both defects is caught."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _level("minidist.runtime.errors") < _level("minidist.distributed.transport.pipe")
    assert _level("minidist.distributed.collectives.ring") > _level("minidist.distributed.world")
