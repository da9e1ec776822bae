"""How much code a reader follows from one call to the bytes: the files, the
functions and their lines (AST spans, docstrings included), each function
counted once, that one call runs inside minidist, with the shortcuts off.

    MINIDIST_FAST_PATHS=0 .venv/bin/python scripts/count_paths.py . ring
    MINIDIST_FAST_PATHS=0 .venv/bin/python scripts/count_paths.py /tmp/old-checkout ddp

TREE is a checkout of minidist (another revision: `git worktree add`); the
paths are ``ring`` (``dist.all_reduce(x, algorithm="ring")``), ``ddp``
(``loss.backward()`` through DDP's hooks and buckets), ``fsdp`` (an FSDP
forward) and ``1f1b`` (a pipeline stage's send of its activation). Rank 0's repeated call is traced, on 2 ranks over shm
(``COUNT_TRANSPORT=pipe`` for the pipe). The
report splits the files above the transport (what the call and the
algorithm are) from the progress engine and its channel (transport/ and
runtime/: what MPI calls the device layer).
docs/ARCHITECTURE.md reports the counts.
"""

from __future__ import annotations

import ast
import os
import sys

TREE = os.path.abspath(sys.argv[1])
WHICH = sys.argv[2]
sys.path.insert(0, TREE)

import numpy as np  # noqa: E402

import minidist  # noqa: E402
import minidist.distributed as dist  # noqa: E402

SKIPPED = ("<module>", "<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>", "<lambda>")
_SPANS: dict[str, dict[int, int]] = {}


def spans(path: str) -> dict[int, int]:
    """First line (of the def or of a decorator) -> the function's lines."""
    if path not in _SPANS:
        found = {}
        with open(path) as file:
            tree = ast.parse(file.read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                found[node.lineno] = lines
                for decorator in node.decorator_list:
                    found[decorator.lineno] = lines
        _SPANS[path] = found
    return _SPANS[path]


def traced(call) -> tuple[dict[str, int], int, int]:
    """({file: lines}, functions, lines) of what ``call()`` runs in minidist."""
    seen = set()

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(TREE + "/minidist"):
            seen.add((code.co_filename, code.co_firstlineno, code.co_name))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    files, functions, total = {}, 0, 0
    for path, first, name in seen:
        lines = spans(path).get(first, 0)
        if not lines or name in SKIPPED:
            continue
        relative = os.path.relpath(path, TREE)
        files[relative] = files.get(relative, 0) + lines
        functions += 1
        total += lines
    return files, functions, total


def ring():
    x = np.ones(1 << 14, np.float32)
    dist.all_reduce(x, algorithm="ring")
    return traced(lambda: dist.all_reduce(x, algorithm="ring"))


def ddp():
    from minidist import Tensor, nn
    from minidist.parallel import DistributedDataParallel

    nn.init.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 8)))
    x = Tensor(np.ones((4, 8), np.float32))
    model(x).sum().backward()
    loss = model(x).sum()
    return traced(loss.backward)


def fsdp():
    from minidist import Tensor, nn
    from minidist.parallel import FullyShardedDataParallel

    nn.init.manual_seed(0)
    model = FullyShardedDataParallel(nn.Sequential(nn.Linear(8, 8)))
    x = Tensor(np.ones((4, 8), np.float32))
    model(x).sum().backward()
    return traced(lambda: model(x))


def pipeline():
    """1F1B on 2 stages: rank 0's send of its first activation, from the
    schedule's action to the bytes."""
    from minidist import Tensor, nn, optim
    from minidist.nn import functional as F
    from minidist.parallel.pipeline import Pipeline, _Batch
    from minidist.parallel.pipeline_schedules import SEND_ACTIVATION

    nn.init.manual_seed(0)
    pipe = Pipeline(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)), "1f1b", 2)
    optimizer = optim.SGD(pipe.parameters(), lr=0.1)
    x = np.ones((4, 8), np.float32)
    y = np.zeros((4, 8), np.float32)

    def loss_fn(output, target):
        return F.mse_loss(output, Tensor(target))

    pipe.step(x, y, loss_fn, optimizer)  # the first step builds what later ones reuse
    counted = []
    plain = _Batch.execute

    def execute(run, index, action):
        if action.kind == SEND_ACTIVATION and not counted:
            counted.append(traced(lambda: plain(run, index, action)))
        else:
            plain(run, index, action)

    _Batch.execute = execute
    pipe.step(x, y, loss_fn, optimizer)
    _Batch.execute = plain
    return counted[0] if counted else None


def main() -> None:
    path = {"ring": ring, "ddp": ddp, "fsdp": fsdp, "1f1b": pipeline}[WHICH]
    files, functions, total = minidist.launch(path, world_size=2, transport=os.environ.get("COUNT_TRANSPORT", "shm"))[0]
    print(f"{WHICH}: {len(files)} files, {functions} functions, {total} lines")
    engine = {name: lines for name, lines in files.items() if "/transport/" in name
              or name.startswith("minidist/runtime/")}
    print(f"   above the transport: {len(files) - len(engine)} files, "
          f"{total - sum(engine.values())} lines; the engine and its channel "
          f"(transport/, runtime/): {len(engine)} files, {sum(engine.values())} lines")
    for name, lines in sorted(files.items(), key=lambda item: -item[1]):
        print(f"   {lines:5d}  {name}")


if __name__ == "__main__":
    main()
