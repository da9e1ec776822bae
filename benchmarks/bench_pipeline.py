"""Pipeline schedules side by side: minidist's Pipeline and torch.distributed.pipelining.

For every schedule, one training step of the same model on the same
processes (p = 2 ranks by default, one BLAS thread each, float32):

  step (ms)         the slowest rank's time of one step (forward, backward,
                    SGD step), median over the timed steps of a round
  torch (ms)        the same schedule in torch.distributed.pipelining on gloo
                    (spawned processes, torch.set_num_threads(1))
  minidist / torch  the two step times' ratio, round by round
  bubble measured   1 - busy / (p x makespan) of a traced step (its F, B, I
                    and W regions), the median over the traced steps
  bubble predicted  the same schedule on the virtual clock with the mean F,
                    B, I and W durations this run measured (equal stages,
                    free messages), what the papers' formulas give for those
                    costs

Schedules and their torch peers: gpipe (ScheduleGPipe), 1f1b (Schedule1F1B),
interleaved_1f1b with 2 chunks a rank (ScheduleInterleaved1F1B), zb_h1
(ScheduleInterleavedZeroBubble on one stage a rank, which is ZB-H1), zb_h2
(no torch peer), zbv (ScheduleZBVZeroBubble), dualpipev (ScheduleDualPipeV).

The model: LAYERS Linear(width, width) + Tanh pairs cut into p stages (2 p
chunks for the interleaved and V schedules), a batch of BATCH examples in m
micro-batches, mean squared error. Every rank builds the same weights;
torch's and minidist's pieces are the same layers.

Rounds interleave the two frameworks (minidist, torch, minidist, ...) so
that a busy moment of the machine falls on both; the figures are per-round
medians, reported as the best round and the median of the rounds.

Usage:
  python benchmarks/bench_pipeline.py             # a few minutes
  python benchmarks/bench_pipeline.py --quick     # a smoke run
  OPENBLAS_CORETYPE=Haswell python benchmarks/bench_pipeline.py   # the other kernels

Writes benchmarks/results/pipeline.json unless --json says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's minidist, installed or not

import numpy as np  # noqa: E402

#: schedule -> (chunks a rank, torch's class, whether torch's takes a list of stages)
SCHEDULES = {
    "gpipe": (1, "ScheduleGPipe", False),
    "1f1b": (1, "Schedule1F1B", False),
    "interleaved_1f1b": (2, "ScheduleInterleaved1F1B", True),
    "zb_h1": (1, "ScheduleInterleavedZeroBubble", True),
    "zb_h2": (1, None, False),
    "zbv": (2, "ScheduleZBVZeroBubble", True),
    "dualpipev": (2, "ScheduleDualPipeV", True),
}
LAYERS = 8
LR = 0.01


def stage_layers(total_stages: int) -> list[list[int]]:
    """Which of the LAYERS layers each of the total stages holds: equal runs."""
    per = LAYERS // total_stages
    return [list(range(s * per, (s + 1) * per)) for s in range(total_stages)]


def weights(width: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The LAYERS layers' (weight, bias), the same for both frameworks."""
    rng = np.random.default_rng(0)
    bound = 1 / np.sqrt(width)
    return [(rng.uniform(-bound, bound, (width, width)).astype(np.float32),
             rng.uniform(-bound, bound, width).astype(np.float32)) for _ in range(LAYERS)]


def batch(width: int, size: int):
    rng = np.random.default_rng(1)
    return (rng.normal(size=(size, width)).astype(np.float32),
            rng.normal(size=(size, width)).astype(np.float32))


def my_stages(name: str, rank: int, ranks: int) -> list[int]:
    """The global stages this rank holds, in its chunks' order."""
    chunks = SCHEDULES[name][0]
    if chunks == 1:
        return [rank]
    if name in ("zbv", "dualpipev"):
        return [rank, 2 * ranks - 1 - rank]
    return [rank + c * ranks for c in range(chunks)]


# ----------------------------------------------------------------- minidist
def minidist_worker(names, width, size, microbatches, warmup, steps, traced):
    import minidist.distributed as dist
    from minidist import nn, optim
    from minidist.parallel.pipeline import Pipeline
    from minidist.runtime.blas_threads import set_blas_threads

    set_blas_threads(1)
    rank, ranks = dist.get_rank(), dist.get_world_size()
    x, y = batch(width, size)
    layers = weights(width)
    times = {}
    for name in names:
        total = ranks * SCHEDULES[name][0]
        pieces = {}
        for stage in my_stages(name, rank, ranks):
            modules = []
            for index in stage_layers(total)[stage]:
                linear = nn.Linear(width, width)
                linear.weight.data[...] = layers[index][0]
                linear.bias.data[...] = layers[index][1]
                modules += [linear, nn.Tanh()]
            pieces[stage] = nn.Sequential(*modules)
        pipe = Pipeline(pieces, name, microbatches, virtual_stages=SCHEDULES[name][0])
        optimizer = optim.SGD(pipe.parameters(), lr=LR)
        loss_fn = nn.MSELoss()
        per_step = []
        for index in range(warmup + steps):
            dist.barrier()
            start = time.perf_counter()
            pipe.step(x, y, loss_fn, optimizer)
            if index >= warmup:
                per_step.append(time.perf_counter() - start)
        times[name] = per_step
    return times


def run_minidist(names, ranks, width, size, microbatches, warmup, steps, trace=None):
    import minidist

    per_rank = minidist.launch(minidist_worker, world_size=ranks, transport="shm",
                               args=(names, width, size, microbatches, warmup, steps,
                                     trace is not None), trace=trace, timeout=600)
    return {name: [max(values) for values in zip(*(r[name] for r in per_rank))]
            for name in names}


def bubbles(trace_path, names, ranks, microbatches, warmup, steps):
    """Per schedule: (measured bubbles of the timed steps, predicted bubble)."""
    from minidist import trace as _trace
    from minidist.parallel.pipeline import bubble_fraction, make_schedule, simulate_schedule
    from minidist.parallel.pipeline.schedules import UNIT_NS

    events = [e for e in _trace.read_jsonl(trace_path).events if e["kind"] == "compute"]
    # The steps follow each other per rank: cut each rank's regions at its
    # optimizer steps ("step" labels), schedule after schedule, step after step.
    per_rank = {r: [] for r in range(ranks)}
    for event in events:
        per_rank[event["rank"]].append(event)
    batches = {r: [[]] for r in range(ranks)}
    for rank, regions in per_rank.items():
        for event in sorted(regions, key=lambda e: e["start"]):
            info = _trace.label_info(event.get("label", ""))
            if info.get("pipeline") == "step":
                batches[rank].append([])
            elif info.get("pipeline") in ("F", "B", "R", "I", "W"):
                batches[rank][-1].append(event)
    found = {}
    for position, name in enumerate(names):
        first = position * (warmup + steps) + warmup
        measured, durations = [], {}
        for step in range(first, first + steps):
            step_events = [e for r in range(ranks) for e in batches[r][step]]
            measured.append(bubble_fraction(step_events, ranks))
            for event in step_events:
                letter = _trace.label_info(event["label"])["pipeline"]
                durations.setdefault(letter, []).append((event["end"] - event["start"]) / UNIT_NS)
        mean = {letter: statistics.fmean(values) for letter, values in durations.items()}
        chunks = SCHEDULES[name][0]
        schedule = make_schedule(name, ranks, microbatches, chunks)
        if "W" in mean:
            backward, weight = mean["I"] + mean["W"], mean["W"]
        else:
            backward, weight = mean["B"], None
        planned = simulate_schedule(schedule, mean["F"], backward, weight_time=weight)
        found[name] = (measured, bubble_fraction(planned, ranks), mean)
    return found


# ------------------------------------------------------------------ PyTorch
def torch_worker(rank, ranks, rendezvous, names, width, size, microbatches, warmup, steps,
                 results):
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = "1"
    import torch
    import torch.distributed as tdist
    from torch.distributed import pipelining

    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                             world_size=ranks)
    x, y = (torch.from_numpy(a) for a in batch(width, size))
    layers = weights(width)
    times = {}
    for name in names:
        chunks, cls_name, takes_list = SCHEDULES[name]
        total = ranks * chunks
        stages = []
        for stage in my_stages(name, rank, ranks):
            modules = []
            for index in stage_layers(total)[stage]:
                linear = torch.nn.Linear(width, width)
                with torch.no_grad():
                    linear.weight.copy_(torch.from_numpy(layers[index][0]))
                    linear.bias.copy_(torch.from_numpy(layers[index][1]))
                modules += [linear, torch.nn.Tanh()]
            stages.append(pipelining.PipelineStage(torch.nn.Sequential(*modules), stage, total,
                                                   torch.device("cpu")))
        schedule = getattr(pipelining, cls_name)(stages if takes_list else stages[0],
                                                 microbatches,
                                                 loss_fn=torch.nn.functional.mse_loss)
        parameters = [p for s in stages for p in s.submod.parameters()]
        optimizer = torch.optim.SGD(parameters, lr=LR)
        first = any(s.is_first for s in stages)
        last = any(s.is_last for s in stages)
        per_step = []
        for index in range(warmup + steps):
            tdist.barrier()
            start = time.perf_counter()
            optimizer.zero_grad()
            schedule.step(*((x,) if first else ()), **(dict(target=y, losses=[]) if last else {}))
            optimizer.step()
            if index >= warmup:
                per_step.append(time.perf_counter() - start)
        times[name] = per_step
    results.put((rank, times))
    tdist.destroy_process_group()


def run_torch(names, ranks, width, size, microbatches, warmup, steps):
    from minidist.bench.common import spawn_torch_ranks

    per_rank = spawn_torch_ranks(torch_worker, ranks, names, width, size, microbatches,
                                 warmup, steps)
    return {name: [max(values) for values in zip(*(per_rank[r][name] for r in range(ranks)))]
            for name in names}


# ------------------------------------------------------------------- driver
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 rounds, few steps")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--schedules", default=",".join(SCHEDULES))
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch")
    parser.add_argument("--json", default=os.path.join(HERE, "results", "pipeline.json"))
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.schedules.split(",") if n.strip()]
    unknown = sorted(set(names) - set(SCHEDULES))
    if unknown:
        parser.error(f"unknown schedules {unknown}; choose from {sorted(SCHEDULES)}")
    if LAYERS % (2 * args.ranks):
        parser.error(f"{LAYERS} layers do not cut into {2 * args.ranks} equal chunks")
    rounds = args.rounds or (2 if args.quick else 5)
    steps = args.steps or (3 if args.quick else 10)
    warmup = 2
    have_torch = not args.no_torch
    if have_torch:
        try:
            import torch.distributed.pipelining  # noqa: F401
        except ImportError:
            print("PyTorch with torch.distributed.pipelining is not installed: minidist only")
            have_torch = False
    torch_names = [n for n in names if SCHEDULES[n][1]]
    sizes = (args.ranks, args.width, args.batch, args.microbatches)

    mine, theirs = {n: [] for n in names}, {n: [] for n in torch_names}
    for round_index in range(rounds):
        for name, values in run_minidist(names, *sizes, warmup, steps).items():
            mine[name].append(statistics.median(values))
        if have_torch and torch_names:
            for name, values in run_torch(torch_names, *sizes, warmup, steps).items():
                theirs[name].append(statistics.median(values))
        print(f"round {round_index + 1}/{rounds} done", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "pipeline.jsonl")
        run_minidist(names, *sizes, warmup, steps, trace=path)
        found = bubbles(path, names, args.ranks, args.microbatches, warmup, steps)

    rows = []
    print(f"\n{args.ranks} ranks, width {args.width}, batch {args.batch}, "
          f"m = {args.microbatches}, {LAYERS} layers, float32, one BLAS thread a rank; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    print(f"{'schedule':<17}{'step ms':>9}{'torch ms':>10}{'ratio':>18}"
          f"{'bubble':>9}{'predicted':>11}")
    for name in names:
        ours = mine[name]
        row = {"schedule": name, "minidist_ms": [1e3 * v for v in ours]}
        ratio_text, torch_text = "-", "-"
        if name in theirs and theirs[name]:
            ratios = [a / b for a, b in zip(ours, theirs[name])]
            row["torch_ms"] = [1e3 * v for v in theirs[name]]
            row["ratio_per_round"] = ratios
            torch_text = f"{1e3 * min(theirs[name]):.1f}"
            ratio_text = f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]"
        measured, predicted, mean = found[name]
        row.update(bubble_measured=measured, bubble_predicted=predicted, mean_region_ms=mean)
        rows.append(row)
        print(f"{name:<17}{1e3 * min(ours):>9.1f}{torch_text:>10}{ratio_text:>18}"
              f"{statistics.median(measured):>9.3f}{predicted:>11.3f}")
    print("(step: the best round's median; ratio: minidist / torch, median [min-max] "
          "over rounds; bubble: measured median of a traced run)")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump({"ranks": args.ranks, "width": args.width, "batch": args.batch,
                   "microbatches": args.microbatches, "layers": LAYERS, "rounds": rounds,
                   "steps": steps, "coretype": os.environ.get("OPENBLAS_CORETYPE"),
                   "load": os.getloadavg(), "rows": rows}, handle, indent=1)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
