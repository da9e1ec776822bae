"""``minidist demo pipeline --schedule 1f1b --stages 4 --microbatches 8``:
a pipeline trained for real on p processes, then stepped through.

An MLP on the bundled 8x8 digits (64 -> 128 -> ... -> 10, ReLU, one Linear
layer per stage: p of them, 2p with two chunks per rank: the interleaved
schedule's, or ZB-V's and DualPipeV's in a V, where rank 0 holds the first
and the last) is cut into stages by :class:`~minidist.parallel.pipeline.executor.Pipeline`,
one per process; every batch of 64 examples is cut into m micro-batches and
run by the schedule's list of actions, with SGD (momentum 0.9) after each
batch. Every schedule of :func:`~minidist.parallel.pipeline.schedules.make_schedule`
runs: GPipe, 1F1B, interleaved 1F1B, and the zero-bubble ones (zb_h1, zb_h2,
zbv, dualpipev), whose backwards split into I and W, drawn as boxes of
their own. The run is traced; the parent prints the loss of each epoch and the
test accuracy, writes the trace with the schedule in its header, and shows
its last batch: the measured bubble next to the formula, the terminal
step-through one time slot at a time (``--play`` plays it; without a
terminal every frame is printed) and, with ``--timeline OUT.png``, the Gantt
chart.

``--simulate`` starts no process: the planned schedule on the simulator's
virtual clock (every stage's forward 1 ms, backward 2 ms, a chunk of the
interleaved schedule half that; messages free), drawn the same way; its
bubble is the formula's exactly.

A real run of p processes on fewer cores than p idles more than the formula
says: waiting processes share the cores with working ones, and a stage's
compute here is short next to the cost of a message. So the Gantt chart of a
real run has two panels: each action at its place in the schedule's order
(the schedule's shape, the same on any machine), and the wall clock, titled
with why its bubble differs (:func:`viz.pipeline_chart.draw_pipeline_gantt`).
The simulator's bubble is called "simulated", a real run's "measured".
"""

from __future__ import annotations

import os

import numpy as np
from rich.console import Console

import minidist
import minidist.distributed as dist
from minidist import nn, optim, trace
from minidist.data import load_digits
from minidist.parallel.pipeline import (
    Pipeline,
    annotate_trace,
    make_schedule,
    simulate_schedule,
)
from minidist.train import evaluate
from viz.terminal import print_commands

BATCH = 64
HIDDEN = 128
LR = 0.1
#: The demo trains at most this many epochs over the digits (22 batches each).
MAX_EPOCHS = 3
#: Model chunks per rank for the interleaved schedule.
INTERLEAVED_CHUNKS = 2
DEFAULT_TRACE = "pipeline.trace.jsonl"
FORWARD_COST, BACKWARD_COST = 1.0, 2.0


def build_mlp(layers: int, seed: int = 0) -> nn.Sequential:
    """``layers`` Linear layers (at least 2) 64 -> 128 -> ... -> 10, ReLU between,
    the same weights for the same ``seed``."""
    nn.init.manual_seed(seed)
    widths = [64] + [HIDDEN] * (max(layers, 2) - 1) + [10]
    modules = []
    for index, (width_in, width_out) in enumerate(zip(widths[:-1], widths[1:])):
        modules.append(nn.Linear(width_in, width_out))
        if index + 2 < len(widths):
            # He initialisation keeps the signal's scale through many ReLU layers
            # (the default one shrinks it layer by layer: 8 layers would not train).
            nn.init.kaiming_normal_(modules[-1].weight, nonlinearity="relu")
            modules.append(nn.ReLU())
    return nn.Sequential(*modules)


def _train(schedule_name, virtual_stages, microbatches, epochs):
    rank = dist.get_rank()
    x_train, y_train, _, _ = load_digits()
    model = build_mlp(dist.get_world_size() * virtual_stages)
    names = {id(p): name for name, p in model.named_parameters()}
    pipe = Pipeline(model, schedule_name, microbatches, virtual_stages=virtual_stages)
    optimizer = optim.SGD(pipe.parameters(), lr=LR, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    order = np.random.default_rng(0)
    losses = []
    for _ in range(epochs):
        # Every rank draws the same permutation: stage 0 reads the inputs, the
        # last stage the targets of the same examples.
        permutation = order.permutation(len(x_train))
        epoch = []
        for start in range(0, len(x_train) - BATCH + 1, BATCH):
            rows = permutation[start:start + BATCH]
            loss = pipe.step(x_train[rows] if pipe.is_first else None,
                             y_train[rows] if pipe.is_last else None, loss_fn, optimizer)
            if pipe.is_last:
                epoch.append(loss)
        losses.append(float(np.mean(epoch)) if epoch else None)
    return {"rank": rank, "last": pipe.is_last, "losses": losses,
            "header": pipe.trace_header(),
            "weights": {names[id(p)]: p.data for p in pipe.parameters()}}


def _count(number: int, one: str, many: str | None = None) -> str:
    """"1 process", "4 processes"."""
    return f"{number} {one if number == 1 else many or one + 's'}"


def _show(chart, console: Console, args) -> None:
    from viz.pipeline_chart import (
        play_pipeline,
        save_pipeline_gantt,
        step_through_pipeline,
    )

    color = not args.no_color
    if args.play:
        play_pipeline(chart, console, speed=args.speed, color=color)
    else:
        step_through_pipeline(chart, console, color=color)
    if args.timeline:
        console.print(f"Gantt chart written to {save_pipeline_gantt(chart, args.timeline)}")


def _simulate(schedule, console: Console, args) -> int:
    from viz.pipeline_chart import pipeline_chart

    v = schedule.virtual_stages
    # A chunk is 1/v of a stage's layers: 1/v of its cost.
    events = simulate_schedule(schedule, FORWARD_COST / v, BACKWARD_COST / v)
    header = trace.make_header(schedule.stages, transport="sim", **schedule.header())
    console.print(f"[bold]minidist demo pipeline --simulate[/bold]: {schedule.name}, "
                  f"{_count(schedule.stages, 'stage')}, "
                  f"{_count(schedule.microbatches, 'micro-batch', 'micro-batches')}"
                  + (f", {v} chunks per rank (each 1/{v} of the cost)" if v > 1 else "")
                  + f"; no processes, a virtual clock: forward {FORWARD_COST:g} ms, backward "
                    f"{BACKWARD_COST:g} ms per stage and micro-batch, messages free")
    if args.trace:
        trace.write_jsonl(args.trace, events, header)
        console.print(f"simulated trace written to {args.trace}")
    _show(pipeline_chart((header, events)), console, args)
    return 0


def _runtime_runs(schedule) -> bool:
    """Whether the runtime has a step for every kind of action the schedule
    holds: its own table of steps (:mod:`minidist.parallel.pipeline.steps`) says."""
    from minidist.parallel.pipeline.steps import _STEPS

    return all(action.kind in _STEPS for actions in schedule.actions for action in actions)


def main(args) -> int:
    from viz.pipeline_chart import pipeline_chart

    console = Console(no_color=args.no_color, highlight=False)
    stages, microbatches = args.stages, args.microbatches
    if stages < 1 or microbatches < 1:
        console.print(f"minidist demo pipeline: --stages and --microbatches must be at least 1, "
                      f"got {stages} and {microbatches}")
        return 2
    if microbatches > BATCH:
        console.print(f"minidist demo pipeline: a batch of {BATCH} examples cannot be cut into "
                      f"{microbatches} micro-batches; use --microbatches <= {BATCH}")
        return 2
    try:
        schedule = make_schedule(args.schedule, stages, microbatches,
                                 INTERLEAVED_CHUNKS if "interleaved" in args.schedule else 1)
    except ValueError as error:
        console.print(f"minidist demo pipeline: {error}")
        return 2
    if args.simulate:
        return _simulate(schedule, console, args)
    if not _runtime_runs(schedule):
        console.print(f"minidist demo pipeline: {schedule.name} splits each backward into its "
                      "input and weight halves (I, W), which this Pipeline does not run; "
                      f"see it planned with `minidist demo pipeline --simulate --schedule "
                      f"{args.schedule}`")
        return 2

    epochs = min(args.epochs, MAX_EPOCHS)
    if epochs < 1:
        console.print(f"minidist demo pipeline: --epochs must be at least 1, got {args.epochs}")
        return 2
    trace_path = args.trace or DEFAULT_TRACE
    v = schedule.virtual_stages
    console.print(f"[bold]minidist demo pipeline[/bold]: {schedule.name} on "
                  f"{_count(stages, 'process', 'processes')}, an MLP of {stages * v} Linear "
                  f"layers ({v} per process) on the 8x8 digits, batches of {BATCH} in "
                  f"{_count(microbatches, 'micro-batch', 'micro-batches')}, SGD lr {LR} momentum "
                  f"0.9, {epochs} epoch{'s' if epochs > 1 else ''}"
                  + (f" (at most {MAX_EPOCHS} in this demo)" if args.epochs > MAX_EPOCHS else ""))
    results = minidist.launch(_train, world_size=stages, transport="shm",
                              args=(schedule.name, v, microbatches, epochs), trace=trace_path)
    annotate_trace(trace_path, results[0]["header"])
    # The rank holding the last stage computes the loss: rank p - 1, or rank 0
    # on the V placement (ZB-V, DualPipeV), where rank 0 holds both ends.
    last = next(result for result in results if result["last"])
    for epoch, loss in enumerate(last["losses"], 1):
        console.print(f"epoch {epoch}: mean loss {loss:.4f}")
    model = build_mlp(stages * v)
    trained = {name: weights for result in results for name, weights in result["weights"].items()}
    for name, param in model.named_parameters():
        param.data = trained[name]
    _, _, x_test, y_test = load_digits()
    console.print(f"test accuracy {evaluate(model, x_test, y_test):.3f}")
    console.print(f"trace written to {trace_path}; draw it again with", markup=False)
    print_commands(console, f"minidist viz {trace_path}",
                   f"minidist viz {trace_path} --timeline pipeline.png")

    chart = pipeline_chart(trace_path)
    cores = os.cpu_count() or 1
    # Why the bubble differs from the formula is said beside it (bubble_text).
    console.print(f"the last batch of {chart.batches}, as it ran on "
                  f"{_count(stages, 'process', 'processes')} and "
                  f"{cores} core{'s' if cores > 1 else ''}")
    _show(chart, console, args)
    return 0
