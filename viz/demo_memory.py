"""``minidist demo memory -n N``: the memory ledger of DDP and ZeRO stages 1-3, live.

N worker processes (default 2) train the course's MLP (64-128-10) on the
bundled digits with Adam, a few steps under each strategy in turn:

  DDP      DistributedDataParallel: every rank the whole model, gradients,
           Adam's two moments
  ZeRO-1   DDP + ZeroRedundancyOptimizer: Adam's moments of one N-th
  ZeRO-2   FullyShardedDataParallel(sharding_strategy="SHARD_GRAD_OP"): + gradients of one N-th
  ZeRO-3   FullyShardedDataParallel(sharding_strategy="FULL_SHARD"): + weights of one N-th
           between their uses

Each rank measures what it holds with a :class:`minidist.memory.Ledger`
(after zero_grad, forward, backward and the optimizer step) and puts the
latest sample on a queue; the parent shows one row per rank and strategy
(bytes per category, the total and the peak) with Rich (in two tables on a
narrow terminal), or prints a plain line per rank and strategy (two on a
narrow one) when standard output is not a terminal. The last
step of each strategy runs in a trace region ``memory step NAME``; the
ledger's samples are ``memory`` events of the trace, and ``--plot OUT.png``
draws them (:func:`viz.memory_chart.save_memory`): memory per rank over one
step, the strategies side by side. At the end, each rank's model-state bytes
(weights + gradients + optimizer state) next to ``zero_model_state_bytes``,
and why ZeRO-3's peak is what it is next to ZeRO-2's (:func:`peak_note`): the
layers' gathered weights stay alive in the autograd graph from each layer's
forward to its backward, so the sample after forward counts them among the
activations; the demo measures how many of those bytes they are.
"""

from __future__ import annotations

import multiprocessing
import threading

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

import minidist
import minidist.distributed as dist
from minidist import Tensor, memory, nn, optim, trace
from minidist.data import load_digits
from minidist.parallel.data import zero_stages
from minidist.parallel.data.costs import zero_model_state_bytes
from minidist.train import build_model
from minidist.units import format_bytes
from viz.memory_chart import GATHERED_KIND, REGION_PREFIX
from viz.terminal import NO_BREAK, fold, print_commands, print_folded

#: (name, ZeRO stage) in the order they run.
STRATEGIES = (("DDP", 0), ("ZeRO-1", 1), ("ZeRO-2", 2), ("ZeRO-3", 3))
STEPS = 3
PER_RANK_BATCH = 32
LR = 0.01
DEFAULT_TRACE = "memory.trace.jsonl"
SHORT = {"parameters": "params", "gradients": "grads", "optimizer_state": "optimizer",
         "buffers": "buffers", "activations": "activations"}


def build(stage: int, model):
    """(the wrapped model, its optimizer, a Ledger of this rank) for a ZeRO
    ``stage`` (0: DDP), Adam, ring collectives."""
    wrapped, optimizer = zero_stages.wrap(model, stage, optim.Adam, algorithm="ring", lr=LR)
    if stage in (0, 1):
        ledger = memory.Ledger(wrapped, optimizer)
        if stage == 1:   # the slice's gradient the inner Adam reads: scratch, not model state
            ledger.track("buffers", optimizer.shard.grad)
        return wrapped, optimizer, ledger
    # The shards and the layers' own parameters (views into the gathered
    # weights while they exist): each byte counts once.
    ledger = memory.Ledger(list(wrapped.shards) + list(model.parameters()), optimizer)
    return wrapped, optimizer, ledger


def gathered_ledger(stage: int, wrapped):
    """For ZeRO-3, a Ledger that sees only the layers' gathered full weights
    (FullyShardedDataParallel.track_memory counts them as ``buffers``, and
    nothing else is one at the forward sample); None for the other stages,
    which gather nothing between forward and backward."""
    if stage != 3:
        return None
    ledger = memory.Ledger()
    wrapped.track_memory(ledger)
    return ledger


def peak_note(results: list[dict]) -> str:
    """Why ZeRO-3's peak per rank is what it is next to ZeRO-2's, in the
    demo's own numbers (the largest rank's): the layers' full weights, gathered
    for forward, stay alive in the autograd graph until each layer's backward
    (minidist's Linear keeps its weight array for it, and the backward gather
    refills that same array), so the sample after forward counts them among
    the activations. "" when there is no ZeRO-3 or ZeRO-2 result."""
    if not results or not all(name in results[0] for name in ("ZeRO-2", "ZeRO-3")):
        return ""
    three = max((result["ZeRO-3"] for result in results), key=lambda r: r["peak"])
    two = max(result["ZeRO-2"]["peak"] for result in results)
    gathered = three["peak_gathered"]
    without = three["peak"] - gathered
    where = "above" if three["peak"] > two else "not above"
    text = (f"ZeRO-3's peak per rank ({format_bytes(three['peak'])}) is {where} ZeRO-2's "
            f"({format_bytes(two)})")
    if not gathered:
        return text + ": at its peak no gathered weights are alive."
    label = (three["peak_label"] or "").split()[-1]
    return (text + f". Of the {format_bytes(three['peak_activations'])} of activations at "
            f"its peak (after {label}), {format_bytes(gathered)} are gathered parameters: "
            "each layer's full weights, gathered for its forward and kept alive by the "
            "autograd graph until its backward (Linear keeps its weight array for it; "
            "torch's FSDP frees them after forward and gathers again). Without them "
            f"ZeRO-3's peak would be {format_bytes(without)}, "
            + ("below" if without < two else "still not below") + " ZeRO-2's.")


def model_state(held: dict) -> int:
    return held["parameters"] + held["gradients"] + held["optimizer_state"]


def _train(status, steps):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    x, y = load_digits()[:2]
    loss_fn = nn.CrossEntropyLoss()
    results = {}
    for name, stage in STRATEGIES:
        model = build_model("mlp", seed=0)
        wrapped, optimizer, ledger = build(stage, model)
        gathered = gathered_ledger(stage, wrapped)
        # bytes of the activations that are gathered weights, per sample label
        in_activations = {}
        for step in range(steps):
            lo = (step * world_size + rank) * PER_RANK_BATCH
            # copies: a view of the data set would keep all of it alive (and counted)
            xb, yb = x[lo:lo + PER_RANK_BATCH].copy(), y[lo:lo + PER_RANK_BATCH].copy()
            with trace.region(REGION_PREFIX + name) if step == steps - 1 else _nothing():
                optimizer.zero_grad(set_to_none=False)
                ledger.sample(f"{name} zero_grad")
                loss = loss_fn(wrapped(Tensor(xb)), yb)
                after_forward = ledger.sample(f"{name} forward", graph=loss)
                if gathered is not None:
                    # what the gathered weights alive now add to the activations
                    # (each byte once: they are among the graph's arrays)
                    in_activations[after_forward.label] = min(
                        gathered.measure()["buffers"], after_forward.bytes["activations"])
                    # in the trace too, at the sample's time, for the chart to draw apart
                    trace.record(GATHERED_KIND, after_forward.time, after_forward.time,
                                 nbytes=in_activations[after_forward.label],
                                 label=f"gathered parameters {name} forward")
                loss.backward()
                ledger.sample(f"{name} backward")
                optimizer.step()
                last = ledger.sample(f"{name} step")
            report = ledger.report()
            status.put({"rank": rank, "strategy": name, "step": step + 1, "steps": steps,
                        "bytes": report.current, "peak": report.peak_total,
                        "loss": float(loss.item())})
        report = ledger.report()
        top = max(report.samples, key=lambda sample: sample.total)
        results[name] = {"model_state": model_state(last.bytes), "bytes": last.bytes,
                         "peak": report.peak_total, "peak_label": report.peak_label,
                         "peak_activations": top.bytes["activations"],
                         "peak_gathered": in_activations.get(top.label, 0)}
    status.close()
    status.join_thread()
    return results


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


#: The live table's columns; a terminal too narrow for all of them gets two
#: tables, each with the first two (the ones before the split, then the rest).
TABLE_COLUMNS = ("rank", "strategy", "step", *SHORT.values(), "total", "peak")
SPLIT = TABLE_COLUMNS.index("buffers")


def _table(latest: dict, nproc: int, width: int = 80):
    """One row per rank and strategy; in two tables (step to optimizer state,
    then buffers to the peak) where one would be wider than ``width``."""
    rows = []
    for name, _ in STRATEGIES:
        for rank in range(nproc):
            row = latest.get((rank, name))
            if row is None:
                rows.append([str(rank), name, "-", *["-"] * (len(SHORT) + 2)])
                continue
            held = row["bytes"]
            rows.append([str(rank), name, f"{row['step']}/{row['steps']}",
                         *(format_bytes(held[c]) for c in memory.CATEGORIES),
                         format_bytes(sum(held.values())), format_bytes(row["peak"])])
    title = f"memory ledger per rank, {nproc} processes (MLP 64-128-10, Adam)"
    # A cell never shorter than "1023.9 KiB": the table does not widen as bytes grow.
    widths = [max(len(column), 10 if index > 2 else 0, *(len(row[index]) for row in rows))
              for index, column in enumerate(TABLE_COLUMNS)]
    if sum(widths) + 3 * len(widths) + 1 <= width:
        return _part(title, range(len(TABLE_COLUMNS)), rows)
    return Group(_part(title, range(SPLIT), rows),
                 _part(f"{title}: the rest", [0, 1, *range(SPLIT, len(TABLE_COLUMNS))], rows))


def _part(title: str, columns, rows: list[list[str]]) -> Table:
    table = Table(title=title, title_justify="left")
    for index in columns:
        table.add_column(TABLE_COLUMNS[index], justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*(row[index] for index in columns))
    return table


def _plain_line(row: dict, width: int = 80) -> str:
    """"rank 0  DDP  step 3/3  params 37.5 KiB  ...  peak 197.3 KiB": one line,
    or two where one is wider than ``width`` (buffers on, under the first)."""
    held = row["bytes"]
    parts = [f"{SHORT[c]} {format_bytes(held[c])}" for c in memory.CATEGORIES]
    ends = [f"total {format_bytes(sum(held.values()))}", f"peak {format_bytes(row['peak'])}"]
    head = f"rank {row['rank']}  {row['strategy']}  step {row['step']}/{row['steps']}  "
    line = head + "  ".join(parts + ends)
    if len(line) <= width:
        return line
    split = list(memory.CATEGORIES).index("buffers")
    return (fold(head + "  ".join(parts[:split]), width) + "\n"
            + fold(" " * 9 + "  ".join(parts[split:] + ends), width))


def _show(status, console: Console, nproc: int) -> None:
    latest: dict = {}
    if console.is_terminal:
        with Live(_table(latest, nproc, console.width), console=console,
                  refresh_per_second=10) as live:
            while (row := status.get()) is not None:
                latest[(row["rank"], row["strategy"])] = row
                live.update(_table(latest, nproc, console.width))
        return
    # The ranks finish a strategy in any order: each strategy's lines wait for
    # every rank's last step and are printed in rank order.
    done: dict = {}
    printed: set = set()
    while (row := status.get()) is not None:
        if row["step"] == row["steps"]:
            done.setdefault(row["strategy"], {})[row["rank"]] = row
            for name, _ in STRATEGIES:
                rows = done.get(name, {})
                if name in printed or len(rows) < nproc:
                    continue
                printed.add(name)
                for rank in sorted(rows):
                    console.print(_plain_line(rows[rank], console.width), markup=False,
                                  soft_wrap=True)
    for name, _ in STRATEGIES:   # a rank that failed: print what arrived, in rank order
        if name not in printed:
            for rank in sorted(done.get(name, {})):
                console.print(_plain_line(done[name][rank], console.width), markup=False,
                              soft_wrap=True)


def shard_gap(measured: int, formula: float, sizes: list[int], nproc: int) -> str:
    """Why the largest rank's bytes and the formula differ ("" when they do not):
    the formula counts psi / N per rank, but each tensor is cut into N shards of
    whole elements, rounded up (the last one padded) where N does not divide its size."""
    if round(measured) == round(formula):
        return ""
    uneven = [size for size in sizes if size % nproc]
    if uneven:
        return (f"{measured - formula:+,.0f} B: {len(uneven)} of {len(sizes)} tensors do not "
                f"split evenly in {nproc}: shards rounded up, the formula is psi / N")
    return f"{measured - formula:+,.0f} B: no known cause (every tensor splits evenly)"


def main(args) -> int:
    nproc = args.nproc
    console = Console(no_color=args.no_color, highlight=False)
    if nproc < 1:
        console.print(f"minidist demo memory: -n must be at least 1, got {nproc}")
        return 2
    steps = STEPS
    trace_path = args.trace or DEFAULT_TRACE
    console.print(f"[bold]minidist demo memory[/bold]: MLP 64-128-10 on the 8x8 digits, "
                  f"{nproc} processes x {PER_RANK_BATCH} examples per step, Adam lr {LR}, "
                  f"{steps} steps under each of DDP, ZeRO stage 1, 2 and 3")
    status = multiprocessing.get_context("fork").Queue()
    viewer = threading.Thread(target=_show, args=(status, console, nproc), daemon=True,
                              name="memory-view")
    viewer.start()
    try:
        results = minidist.launch(_train, world_size=nproc, transport="shm",
                                  args=(status, steps), trace=trace_path)
    finally:
        status.put(None)
        viewer.join(10.0)

    model = build_model("mlp")
    psi = model.num_parameters()
    sizes = [parameter.data.size for parameter in model.parameters()]
    print_folded(console, f"model-state bytes per rank after the step (weights + gradients + "
                 f"Adam's moments; {psi:,} parameters), measured next to "
                 f"zero_model_state_bytes:")
    for name, stage in STRATEGIES:
        formula = zero_model_state_bytes(psi, nproc, stage)
        # "rank 0 153,760" and "formula 153,760" stay on one line each.
        measured = ", ".join(f"rank{NO_BREAK}{rank}{NO_BREAK}{result[name]['model_state']:,}"
                             for rank, result in enumerate(results))
        peaks = ", ".join(f"{result[name]['peak']:,} after {(result[name]['peak_label'] or '? ?').split()[-1]}"
                          for result in results)
        gap = shard_gap(max(result[name]["model_state"] for result in results), formula,
                        sizes, nproc)
        print_folded(console, f"  {name:7s} measured {measured}  formula{NO_BREAK}{formula:,.0f}"
                     f"{f' ({gap})' if gap else ''}", indent=8)
        print_folded(console, f"{'':9s} peak per rank {peaks}", indent=2)
    print_folded(console, "(a peak is the largest of a rank's samples, taken after zero_grad, "
                 "forward, backward and the step; zero_grad(set_to_none=False) zeroes the "
                 "gradients in place, so they are held from the first backward on, and the "
                 "sample after forward counts them next to the activations)", indent=1)
    note = peak_note(results)
    if note:
        print_folded(console, note, indent=0)
    console.print(f"trace written to {trace_path}; its memory events per rank:", markup=False)
    print_commands(console, "from minidist import memory, trace",
                   f"memory.memory_timeline(trace.read_jsonl({trace_path!r}).events)")
    plot = getattr(args, "plot", None)
    if plot:
        from viz.memory_chart import save_memory

        console.print(f"memory plot saved to {save_memory(trace_path, plot)}")
    return 0
