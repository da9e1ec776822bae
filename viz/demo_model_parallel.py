"""``minidist demo model-parallel -n 2``: the digits MLP trained with its
weight matrices split, then the messages of its last step stepped through.

N processes (default 2) train the course's MLP (64 -> 128 -> ReLU -> 10) on
the bundled 8x8 digits with Megatron-LM's pairing of
:mod:`minidist.parallel.tensor.layers`: the first layer split by columns
(:class:`~minidist.parallel.tensor.layers.ColumnParallelLinear`, each rank
128/N hidden units, its output left split), the second by rows
(:class:`~minidist.parallel.tensor.layers.RowParallelLinear`, each rank the
matching 128/N inputs, the partial logits added with a ring all_reduce).
Every rank sees the same batches of 64 (model parallel: the whole batch, a
slice of the model) and updates its own slices with SGD (momentum 0.9).

The run is traced, every step a region. The parent prints the loss of each
epoch and the test accuracy, then the bytes of one step, per layer, from
the formula (:mod:`minidist.parallel.model.costs`) next to the
trace of the last step: the only message is the row layer's forward
all_reduce of the 64 x 10 partial logits (the column layer's backward
all_reduce of dX does not run, since its input is the data, which needs no
gradient), against data parallel's all_reduce of every gradient. Then it
steps through the collective calls of the last step with the replay of
:mod:`viz.terminal` (``--play`` plays them; without a terminal every frame
is printed), and with ``--timeline OUT.png`` draws that step's timeline.
"""

from __future__ import annotations

import numpy as np
from rich.console import Console

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, optim, trace
from minidist.data import load_digits
from minidist.distributed.collectives.traffic import ring_all_reduce_sent
from minidist.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear
from minidist.train import build_model, evaluate
from viz.terminal import fold, print_commands, print_folded

#: -n when none is given (the demo parser's default of 4 is the collectives').
DEFAULT_NPROC = 2
#: The demo trains at most this many epochs (22 batches each).
MAX_EPOCHS = 5
BATCH = 64
LR = 0.1
HIDDEN = 128
DEFAULT_TRACE = "model_parallel.trace.jsonl"


def split_mlp() -> nn.Sequential:
    """This rank's slices of ``build_model("mlp")``: column split, ReLU, row split."""
    first, relu, second = build_model("mlp", seed=0)
    return nn.Sequential(ColumnParallelLinear.from_linear(first), relu,
                         RowParallelLinear.from_linear(second))


def _train(epochs: int):
    x_train, y_train, x_test, y_test = load_digits()
    model = split_mlp()
    optimizer = optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    order = np.random.default_rng(0)  # the same batches on every rank
    losses, step = [], 0
    for _ in range(epochs):
        permutation = order.permutation(len(x_train))
        epoch = []
        for start in range(0, len(x_train) - BATCH + 1, BATCH):
            rows = permutation[start:start + BATCH]
            with trace.region(f"step {step}", kind="step"):
                optimizer.zero_grad()
                with trace.region("forward"):
                    loss = loss_fn(model(Tensor(x_train[rows])), y_train[rows])
                with trace.region("backward"):
                    loss.backward()
                with trace.region("update"):
                    optimizer.step()
            epoch.append(float(loss.item()))
            step += 1
        losses.append(float(np.mean(epoch)))
    # Evaluation runs the split forward too: every rank takes part.
    accuracy = evaluate(model, x_test, y_test)
    return {"rank": dist.get_rank(), "losses": losses, "steps": step, "accuracy": accuracy,
            "shards": [(layer.shard.start, layer.shard.stop) for layer in (model[0], model[2])]}


def last_step_events(events: list[dict], step: int) -> list[dict]:
    """Every event inside the region ``step {step}`` of its own rank."""
    windows = {e["rank"]: (e["start"], e["end"]) for e in events
               if e["kind"] == "step" and e["label"] == f"step {step}"}
    return [e for e in events if e["rank"] in windows
            and windows[e["rank"]][0] <= e["start"] and e["end"] <= windows[e["rank"]][1]]


def sent_bytes(events: list[dict], rank: int) -> int:
    return sum(e["bytes"] for e in events if e["rank"] == rank and e["kind"] == "send")


def bytes_table(events: list[dict], nproc: int, width: int = 80) -> str:
    """One step's bytes per rank: the formula per layer, the trace, and data
    parallel; a row's name and its bytes on one line (the bytes folded at
    ", " where they do not fit), what moves on the lines under it."""
    itemsize = 4
    row = [v * itemsize for v in ring_all_reduce_sent(BATCH * 10, nproc)]
    data_parallel = [v * itemsize for v in
                     ring_all_reduce_sent(build_model("mlp").num_parameters(), nproc)]
    traced = [sent_bytes(events, rank) for rank in range(nproc)]

    def per_rank(values):
        return ", ".join(f"{v:,}" for v in values)

    lines = [
        ("layer 1: Linear 64 -> 128, column split",
         f"forward -, backward all_reduce dX {BATCH}x64: not run (its input is the data)",
         per_rank([0] * nproc)),
        ("layer 2: Linear 128 -> 10, row split",
         f"forward all_reduce Y {BATCH}x10 (partial logits, added), backward -",
         per_rank(row)),
        ("one step, formula", "", per_rank(row)),
        ("one step, trace of the last step", "", per_rank(traced)),
        ("data parallel on the same MLP, formula", "all_reduce of every gradient, "
         f"{build_model('mlp').num_parameters():,} values", per_rank(data_parallel)),
    ]
    names = max(len(line[0]) for line in lines)
    head = fold(f"bytes sent per rank per step ({nproc} ranks, ring collectives, float32), "
                "rank 0 first", width)
    rows = []
    for name, what, sent in lines:
        # The bytes start where the longest name ends, and fold back under themselves.
        row = fold(f"  {name.ljust(names)}  {sent}", width, indent=names + 2)
        rows.append(row if not what else row + "\n" + fold(f"      {what}", width))
    return "\n".join([head, *rows])


def _show(events: list[dict], header: dict, console: Console, args) -> None:
    from viz import terminal
    from viz.replay import replays

    calls = replays(trace.Trace(header, events))
    color = not args.no_color
    print_folded(console, f"the last step's {len(calls)} collective call{'s' if len(calls) != 1 else ''}: "
                  + ", ".join(f"{c.collective} ({c.algorithm}, {c.count:,} x {c.itemsize} bytes)"
                              for c in calls))
    for index, call in enumerate(calls, 1):
        console.rule(f"call {index} of {len(calls)}: {call.collective} {call.algorithm}")
        if args.play:
            terminal.play(call, console, speed=args.speed, color=color)
        else:
            terminal.step_through(call, console, color=color)


def main(args) -> int:
    console = Console(no_color=args.no_color, highlight=False)
    nproc = DEFAULT_NPROC if args.nproc is None else args.nproc
    if nproc < 1 or HIDDEN % nproc:
        console.print(f"minidist demo model-parallel: -n must divide the hidden layer's "
                      f"{HIDDEN} units (1, 2, 4, 8, ...), got {nproc}")
        return 2
    epochs = min(args.epochs, MAX_EPOCHS)
    if epochs < 1:
        console.print(f"minidist demo model-parallel: --epochs must be at least 1, "
                      f"got {args.epochs}")
        return 2
    trace_path = args.trace or DEFAULT_TRACE
    console.print(f"[bold]minidist demo model-parallel[/bold]: MLP 64 -> 128 -> 10 on the 8x8 "
                  f"digits, split over {nproc} process{'es' if nproc > 1 else ''}: layer 1 by "
                  f"columns ({HIDDEN // nproc} hidden units each), layer 2 by rows; every "
                  f"rank the same batches of {BATCH}, SGD lr {LR} momentum 0.9, {epochs} "
                  f"epoch{'s' if epochs > 1 else ''}"
                  + (f" (at most {MAX_EPOCHS} in this demo)" if args.epochs > MAX_EPOCHS else ""))
    results = minidist.launch(_train, world_size=nproc, transport="shm", args=(epochs,),
                              trace=trace_path)
    first = results[0]
    for epoch, loss in enumerate(first["losses"], 1):
        console.print(f"epoch {epoch}: mean loss {loss:.4f}")
    print_folded(console, f"test accuracy {first['accuracy']:.3f} after {first['steps']} steps; "
                 f"rank r holds hidden units "
                 f"{', '.join(f'{a}:{b}' for a, b in (r['shards'][0] for r in results))}")
    written = trace.read_jsonl(trace_path)
    events = last_step_events(written.events, first["steps"] - 1)
    console.print(bytes_table(events, nproc, console.width), markup=False, soft_wrap=True)
    console.print(f"trace written to {trace_path}; draw it with", markup=False)
    print_commands(console, f"minidist viz {trace_path} --timeline model_parallel.png")
    if args.timeline:
        from viz.timeline import save_timeline

        path = save_timeline(events, args.timeline,
                             title=f"the last step of the split MLP, {nproc} ranks")
        console.print(f"timeline of the last step written to {path}")
    _show(events, written.header, console, args)
    return 0
