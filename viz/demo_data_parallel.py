"""``minidist demo data-parallel -n N``: DDP training on N processes, watched live.

N worker processes train the course's MLP (64-128-10) on the bundled digits
with :class:`~minidist.parallel.data.ddp.DistributedDataParallel` (ring
all_reduce): each rank reads its shard of every epoch through a
DistributedSampler, 32 examples per step, so the global batch is 32 N. The
parent shows one row per rank (progress, loss, bytes sent, steps/s), fed by
the workers: after every step each puts a small dict on a multiprocessing
queue made before the launch, and a thread of the parent draws them. When
standard output is not a terminal it prints a plain line per rank and epoch
instead.

The run is traced (every message, and forward / backward / update regions);
the parent writes the trace, prints the test accuracy, the bytes each rank
sent per step next to the ring's 2 (n - 1) / n M, and how to draw the trace.
"""

from __future__ import annotations

import multiprocessing
import threading
import time

from rich.console import Console
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, optim, trace
from minidist.data import DataLoader, DistributedSampler, load_digits
from minidist.parallel.data.ddp import DistributedDataParallel
from minidist.train import build_model, evaluate
from minidist.units import format_bytes
from viz.terminal import print_commands, print_folded

#: The demo trains at most this many epochs (the demo parser's default, 20,
#: is the tour's single-process training): about 95 % accuracy in seconds.
MAX_EPOCHS = 10
PER_RANK_BATCH = 32
LR = 0.1
DEFAULT_TRACE = "data_parallel.trace.jsonl"


class _SentBytes:
    """Bytes this rank has sent so far, read from its own trace recorder
    (every send is recorded there), scanning only the events added since."""

    def __init__(self):
        self.total = 0
        self.scanned = 0

    def __call__(self) -> int:
        recorder = trace.current()
        if recorder is not None:
            events = recorder.events
            kind, nbytes = trace.FIELDS.index("kind"), trace.FIELDS.index("bytes")
            self.total += sum(event[nbytes] for event in events[self.scanned:]
                              if event[kind] == "send")
            self.scanned = len(events)
        return self.total


def _train(status, epochs):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    x_train, y_train, x_test, y_test = load_digits()
    ddp = DistributedDataParallel(build_model("mlp", seed=0), algorithm="ring")
    optimizer = optim.SGD(ddp.parameters(), lr=LR, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    sampler = DistributedSampler(len(x_train), num_replicas=world_size, rank=rank, seed=0)
    loader = DataLoader((x_train, y_train), batch_size=PER_RANK_BATCH, sampler=sampler)
    steps = epochs * len(loader)
    sent = _SentBytes()
    startup = sent()  # the broadcast of rank 0's weights, before the first step
    step = 0
    start = time.perf_counter()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            optimizer.zero_grad(set_to_none=False)
            with trace.region("forward"):
                loss = loss_fn(ddp(Tensor(xb)), yb)
            with trace.region("backward"):
                loss.backward()
            with trace.region("update"):
                optimizer.step()
            step += 1
            status.put({"rank": rank, "epoch": epoch + 1, "epochs": epochs, "step": step,
                        "steps": steps, "loss": float(loss.item()), "sent": sent(),
                        "seconds": time.perf_counter() - start})
    # Push what the queue's feeder thread still holds before the process ends.
    status.close()
    status.join_thread()
    return {"accuracy": evaluate(ddp.module, x_test, y_test), "steps": steps,
            "sent_in_steps": sent() - startup,
            "seconds": time.perf_counter() - start, "loss": float(loss.item())}


def bytes_per_step_by_call(events: list[dict], rank: int, steps: int) -> dict[str, float]:
    """The bytes ``rank`` sent per training step, by the call that sent them
    ("all_reduce ring" for the gradients, "all_reduce one_shot" for DDP's
    count of examples, ...), from the trace: sends from its first "forward"
    on (the weights' broadcast before it is start-up), largest first."""
    mine = [event for event in events if event["rank"] == rank]
    starts = [event["start"] for event in mine
              if event["kind"] == "compute" and trace.label_text(event.get("label") or "") == "forward"]
    if not starts or steps < 1:
        return {}
    sent: dict[str, int] = {}
    for event in mine:
        if event["kind"] == "send" and event["start"] >= starts[0]:
            name = trace.label_text(event.get("label") or "").split(":")[0] or "other"
            sent[name] = sent.get(name, 0) + int(event.get("bytes") or 0)
    return {name: total / steps for name, total in sorted(sent.items(), key=lambda item: -item[1])}


def ring_gap(measured: float, formula: float, nproc: int, elements: int) -> str:
    """Why one rank's ring bytes and 2(n-1)/n M differ: the formula is the
    mean over ranks, and with M's elements not a multiple of n the ring's n
    chunks differ by an element."""
    if round(measured) == round(formula):
        return "equal"
    if elements % nproc:
        return (f"{measured - formula:+,.0f} B: {elements:,} elements in {nproc} chunks are "
                "unequal, and the formula is the ranks' mean")
    return f"{measured - formula:+,.0f} B: no known cause (chunks are equal)"


#: The table's columns but the progress bar take this many of the terminal's.
TABLE_WITHOUT_BAR = 62


def _table(latest: dict, nproc: int, width: int = 80) -> Table:
    """One row per rank; the progress bar as wide as the terminal leaves it
    (at most 30), so the table fits in ``width`` columns."""
    bar = max(8, min(30, width - TABLE_WITHOUT_BAR))
    table = Table(title=f"DistributedDataParallel on {nproc} processes (ring all_reduce)",
                  title_justify="left")
    for column in ("rank", "progress", "epoch", "step", "loss", "sent", "steps/s"):
        table.add_column(column, justify="left" if column == "progress" else "right")
    for rank in range(nproc):
        row = latest.get(rank)
        if row is None:
            table.add_row(str(rank), ProgressBar(total=1, completed=0, width=bar), "-", "-", "-",
                          "-", "-")
            continue
        table.add_row(str(rank), ProgressBar(total=row["steps"], completed=row["step"], width=bar),
                      f"{row['epoch']}/{row['epochs']}", f"{row['step']}/{row['steps']}",
                      f"{row['loss']:.4f}", format_bytes(row["sent"]),
                      f"{row['step'] / max(row['seconds'], 1e-9):,.0f}")
    return table


def _plain_line(row: dict) -> str:
    return (f"rank {row['rank']}  epoch {row['epoch']}/{row['epochs']}  "
            f"step {row['step']}/{row['steps']}  loss {row['loss']:.4f}  "
            f"sent {format_bytes(row['sent'])}  "
            f"{row['step'] / max(row['seconds'], 1e-9):,.0f} steps/s")


def _show(status, console: Console, nproc: int) -> None:
    """Draw the workers' status until the parent puts None on the queue."""
    latest: dict[int, dict] = {}
    if console.is_terminal:
        with Live(_table(latest, nproc, console.width), console=console,
                  refresh_per_second=10) as live:
            while (row := status.get()) is not None:
                latest[row["rank"]] = row
                live.update(_table(latest, nproc, console.width))
        return
    while (row := status.get()) is not None:
        steps_per_epoch = row["steps"] // row["epochs"]
        if row["step"] % steps_per_epoch == 0:
            console.print(_plain_line(row))


def main(args) -> int:
    nproc = args.nproc
    console = Console(no_color=args.no_color, highlight=False)
    if nproc < 1:
        console.print(f"minidist demo data-parallel: -n must be at least 1, got {nproc}")
        return 2
    epochs = min(args.epochs, MAX_EPOCHS)
    if epochs < 1:
        console.print(f"minidist demo data-parallel: --epochs must be at least 1, got {args.epochs}")
        return 2
    trace_path = args.trace or DEFAULT_TRACE
    console.print(f"[bold]minidist demo data-parallel[/bold]: MLP 64-128-10 on the 8x8 digits, "
                  f"{nproc} processes x {PER_RANK_BATCH} examples per step (global batch "
                  f"{nproc * PER_RANK_BATCH}), SGD lr {LR} momentum 0.9, {epochs} epoch{'s' if epochs > 1 else ''}"
                  + (f" (at most {MAX_EPOCHS} in this demo)" if args.epochs > MAX_EPOCHS else ""))
    # Made before the launch, so the forked workers inherit it.
    status = multiprocessing.get_context("fork").Queue()
    viewer = threading.Thread(target=_show, args=(status, console, nproc), daemon=True,
                              name="data-parallel-view")
    viewer.start()
    try:
        results = minidist.launch(_train, world_size=nproc, transport="shm",
                                  args=(status, epochs), trace=trace_path)
    finally:
        status.put(None)
        viewer.join(10.0)

    model_bytes = build_model("mlp").num_parameters() * 4
    first = results[0]
    console.print(f"test accuracy {first['accuracy']:.3f} after {first['steps']} steps "
                  f"({first['seconds']:.2f} s on rank 0), last loss {first['loss']:.4f}")
    per_step = [result["sent_in_steps"] / result["steps"] for result in results]
    formula = 2 * (nproc - 1) / nproc * model_bytes
    print_folded(console, f"bytes sent per step: "
                 f"{', '.join(f'rank {r} {b:,.0f}' for r, b in enumerate(per_step))}; "
                 f"ring all_reduce 2(n-1)/n M = {formula:,.0f} "
                 f"(M = {model_bytes:,} bytes of float32 gradients)")
    if nproc > 1:
        calls = bytes_per_step_by_call(trace.read_jsonl(trace_path).events, 0, first["steps"])
        print_folded(console, "  rank 0's, by call: " + " + ".join(
            f"{name} {nbytes:,.0f}" for name, nbytes in calls.items())
            + (f"; the ring's {calls.get('all_reduce ring', 0):,.0f} vs the formula's "
               f"{formula:,.0f}: "
               f"{ring_gap(calls.get('all_reduce ring', 0), formula, nproc, model_bytes // 4)}"))
    console.print(f"trace written to {trace_path}", markup=False)
    console.print("draw it, or export it for Perfetto (ui.perfetto.dev):")
    print_commands(console, f"minidist viz {trace_path} --timeline data_parallel.png",
                   f"minidist viz {trace_path} --chrome data_parallel.json")
    if args.timeline:
        from viz.timeline import save_timeline

        console.print(f"timeline saved to {save_timeline(trace_path, args.timeline)}")
    return 0
