"""How much code a reader follows from one call: the files, the functions and
their lines (AST spans, docstrings included), each function counted once,
that the call runs inside minidist, with the shortcuts off.

    MINIDIST_FAST_PATHS=0 .venv/bin/python scripts/count_paths.py . ring
    MINIDIST_FAST_PATHS=0 COUNT_TRANSPORT=pipe .venv/bin/python scripts/count_paths.py /tmp/old ddp

TREE is a checkout of minidist (another revision: `git worktree add`). The
paths, each traced once on rank 0 of 2 (a repeated call; shm, or
``COUNT_TRANSPORT=pipe``), each read in the ways its report names:

* ``ring``, ``dist.all_reduce(x, algorithm="ring")``: to the bytes; to the
  transport's door (``isend`` / ``irecv`` / ``wait``, where MPICH's ring
  hands over to ``MPIC_Isend``); and the engine behind that door (the
  progress engine, its channel, the checks a wait makes);
* ``ddp``, ``loss.backward()`` under DistributedDataParallel: to the bytes,
  and from the gradient hook to the bucket's ``all_reduce`` call;
* ``fsdp``, a FullyShardedDataParallel forward: to the bytes, and the hooks
  that gather and free the weights, to the ``all_gather`` call (the layer's
  own arithmetic not counted);
* ``1f1b``, a pipeline stage's send of its activation, from the schedule's
  action: to the bytes, and to the transport's ``isend``.

A reading *stops* at a door: a function of the files behind it is not
counted, nor anything it calls. A cached function (``functools.lru_cache``)
that hits its cache runs no Python frame and is not seen.
docs/ARCHITECTURE.md reports the counts and ``tests/test_reading_paths.py``
holds them there.
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


#: Where a reading may stop: the transport's door, or the collectives' face
#: (``dist.all_reduce``, ``dist.all_gather``).
TRANSPORT = ("minidist/distributed/transport/",)
COLLECTIVES = ("minidist/distributed/collectives/",) + TRANSPORT
#: A layer's arithmetic (the autograd and the functions it records).
COMPUTE = ("minidist/tensor.py", "minidist/nn/functional.py")


def traced(call, readings: dict) -> dict:
    """Run ``call()`` once; for each reading ``name: (start, stop)``, the
    ({file: lines}, functions, lines) of what it runs in minidist.

    ``start``: count only from a function of these files down (None: from
    the call); ``stop``: do not count a function of these files, nor
    anything it calls (the reading stops at its door)."""
    names = list(readings)
    seen = {name: set() for name in names}
    # Per reading, one state per live frame: what the frame's callees inherit.
    outside, counting, stopped = 0, 1, 2
    stacks = {name: [counting if readings[name][0] is None else outside] for name in names}

    def profile(frame, event, arg):
        if event == "call":
            path = frame.f_code.co_filename
            relative = os.path.relpath(path, TREE) if path.startswith(TREE + "/") else ""
            for name in names:
                start, stop = readings[name]
                states = stacks[name]
                parent = states[-1]
                if parent == stopped or (stop and relative.startswith(stop)):
                    state = stopped
                elif parent == counting or (start and relative.startswith(start)):
                    state = counting
                else:
                    state = outside
                states.append(state)
                if state == counting and relative.startswith("minidist/"):
                    code = frame.f_code
                    seen[name].add((path, code.co_firstlineno, code.co_name))
        elif event == "return":
            for states in stacks.values():
                if len(states) > 1:
                    states.pop()

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return {name: _count(seen[name]) for name in names}


def _count(seen) -> tuple[dict[str, int], int, int]:
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

    def call():
        dist.all_reduce(x, algorithm="ring")

    return traced(call, {"to the bytes": (None, ()),
                         "to the transport's isend / irecv / wait": (None, TRANSPORT),
                         "the engine: from the transport's door to the bytes": (TRANSPORT, ())})


def ddp():
    from minidist import Tensor, nn
    from minidist.parallel import DistributedDataParallel

    nn.init.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 8)))
    x = Tensor(np.ones((4, 8), np.float32))
    model(x).sum().backward()
    loss = model(x).sum()
    return traced(loss.backward, {
        "to the bytes": (None, ()),
        "the gradient hook to the bucket's all_reduce": (
            # (the second path: a tree from before the families)
            ("minidist/parallel/data/ddp.py", "minidist/parallel/data_parallel.py"), COLLECTIVES)})


def fsdp():
    from minidist import Tensor, nn
    from minidist.parallel import FullyShardedDataParallel

    nn.init.manual_seed(0)
    model = FullyShardedDataParallel(nn.Sequential(nn.Linear(8, 8)))
    x = Tensor(np.ones((4, 8), np.float32))
    model(x).sum().backward()

    def forward():
        model(x)

    return traced(forward, {
        "to the bytes": (None, ()),
        # The layer's own arithmetic is not part of how its weights get there.
        "the hooks that gather and free the weights, to the all_gather": (
            ("minidist/parallel/data/fsdp.py", "minidist/parallel/zero.py"), COLLECTIVES + COMPUTE)})


def pipeline():
    """1F1B on 2 stages: rank 0's send of its first activation, from the
    schedule's action to the bytes."""
    from minidist import Tensor, nn, optim
    from minidist.nn import functional as F
    from minidist.parallel.pipeline.executor import Pipeline
    from minidist.parallel.pipeline.schedules import SEND_ACTIVATION
    from minidist.parallel.pipeline.steps import BatchRun

    nn.init.manual_seed(0)
    pipe = Pipeline(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)), "1f1b", 2)
    optimizer = optim.SGD(pipe.parameters(), lr=0.1)
    x = np.ones((4, 8), np.float32)
    y = np.zeros((4, 8), np.float32)

    def loss_fn(output, target):
        return F.mse_loss(output, Tensor(target))

    pipe.step(x, y, loss_fn, optimizer)  # the first step builds what later ones reuse
    counted = []
    plain = BatchRun.execute

    def execute(run, index, action):
        if action.kind == SEND_ACTIVATION and not counted:
            def send():
                plain(run, index, action)

            counted.append(traced(send, {"to the bytes": (None, ()),
                                         "to the transport's isend": (None, TRANSPORT)}))
        else:
            plain(run, index, action)

    BatchRun.execute = execute
    pipe.step(x, y, loss_fn, optimizer)
    BatchRun.execute = plain
    return counted[0] if counted else None


def main() -> None:
    path = {"ring": ring, "ddp": ddp, "fsdp": fsdp, "1f1b": pipeline}[WHICH]
    transport = os.environ.get("COUNT_TRANSPORT", "shm")
    readings = minidist.launch(path, world_size=2, transport=transport)[0]
    for reading, (files, functions, total) in readings.items():
        print(f"{WHICH}, {reading} ({transport}): {len(files)} files, {functions} functions, "
              f"{total} lines")
        for name, lines in sorted(files.items(), key=lambda item: -item[1]):
            print(f"   {lines:5d}  {name}")


if __name__ == "__main__":
    main()
