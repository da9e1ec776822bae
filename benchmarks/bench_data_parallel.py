"""Weak scaling of data-parallel training: minidist DDP, the coordinator, and PyTorch DDP.

Every worker keeps the same batch (weak scaling), so n workers process n
times the examples per step; perfect scaling keeps the step time constant.
For n = 1, 2 and 4 workers, each limited to one BLAS thread:

  samples/s    n * batch * steps / (time of those steps on the slowest rank)
  efficiency   samples/s at n / (n * samples/s at 1), the flavour's own n = 1
  DDP / torch  minidist DDP's step time over PyTorch DDP's (gloo), same n

Flavours: ``independent`` (each worker runs the same single-process step
and never communicates: the ceiling any data-parallel flavour can reach on
this machine, since n processes share its caches and memory bandwidth),
minidist ``DistributedDataParallel`` (ring all_reduce, overlapped
25 MB buckets), minidist ``CoordinatorDataParallel`` (gather to rank 0,
update there, broadcast the weights), and ``torch.nn.parallel.
DistributedDataParallel`` on gloo (spawned processes, ``torch.set_num_threads(1)``,
rendezvous through a file) when PyTorch is installed.

Models and data (float32, SGD lr 0.01 momentum 0.9), as in
``bench_training_step.py``:
  mlp  784-512-512-10, ReLU, 128 examples per worker
  cnn  Conv(1->16, 3x3, pad 1) ReLU MaxPool2 Conv(16->32, 3x3, pad 1) ReLU
       MaxPool2 Flatten Linear(32*7*7 -> 10), 64 examples per worker
on the bundled 8x8 digits upscaled to 28x28 by nearest neighbour (784
pixels: the MLP reads them flat, the CNN as one channel). Each rank reads its
own consecutive slices of the training set.

Usage:
  python benchmarks/bench_data_parallel.py            # a few minutes
  python benchmarks/bench_data_parallel.py --quick    # a smoke run (n = 1, 2, few steps)

Writes benchmarks/results/data_parallel.json unless --json says otherwise.
On a machine with fewer cores than workers (n = 4 on 2 cores) the ranks take
turns on the CPU and the efficiency says so.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's minidist, installed or not

import numpy as np  # noqa: E402

BATCH = {"mlp": 128, "cnn": 64}
LR, MOMENTUM = 0.01, 0.9
DISTINCT_BATCHES = 8  # per rank, cycled: the data is read, not regenerated, each step


def digits_28x28(flat: bool) -> tuple[np.ndarray, np.ndarray]:
    """The training digits at 28x28, nearest neighbour: pixel (i, j) of the
    big image is pixel (8 i // 28, 8 j // 28) of the small one."""
    from minidist.data import load_digits

    x, y = load_digits(flatten=False)[:2]
    rows = np.arange(28) * 8 // 28
    big = np.ascontiguousarray(x[:, :, rows][:, :, :, rows], dtype=np.float32)
    return (big.reshape(len(big), -1) if flat else big), y


def rank_batches(model_name: str, rank: int, world_size: int):
    """This rank's DISTINCT_BATCHES batches: consecutive slices, interleaved by rank."""
    x, y = digits_28x28(flat=model_name == "mlp")
    batch = BATCH[model_name]
    batches = []
    for step in range(DISTINCT_BATCHES):
        index = (np.arange(batch) + (step * world_size + rank) * batch) % len(x)
        batches.append((np.ascontiguousarray(x[index]), y[index]))
    return batches


def timed_windows(step, barrier, warmup: int, windows: int, steps: int) -> list[float]:
    """Seconds of ``steps`` steps, ``windows`` times, each window started
    together on every rank (after a barrier)."""
    for index in range(warmup):
        step(index)
    times = []
    for _ in range(windows):
        barrier()
        start = time.perf_counter()
        for index in range(steps):
            step(index)
        times.append(time.perf_counter() - start)
    return times


# ----------------------------------------------------------------- minidist
def minidist_model(name: str):
    from minidist import nn

    nn.init.manual_seed(0)
    if name == "mlp":
        return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                             nn.Linear(512, 10))
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 10),
    )


def minidist_worker(model_name: str, flavour: str, warmup: int, windows: int, steps: int):
    import minidist.distributed as dist
    from minidist import Tensor, nn, optim
    from minidist.parallel.data.coordinator import CoordinatorDataParallel
    from minidist.parallel.data.ddp import DistributedDataParallel
    from minidist.runtime.blas_threads import set_blas_threads

    set_blas_threads(1)  # launch gives a lone worker every core; one thread each, always
    model = minidist_model(model_name)
    loss_fn = nn.CrossEntropyLoss()
    batches = rank_batches(model_name, dist.get_rank(), dist.get_world_size())
    if flavour == "independent":
        optimizer = optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

        def step(index):
            x, y = batches[index % DISTINCT_BATCHES]
            optimizer.zero_grad(set_to_none=False)
            loss_fn(model(Tensor(x)), y).backward()
            optimizer.step()
    elif flavour == "ddp":
        ddp = DistributedDataParallel(model, algorithm="ring")
        optimizer = optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)

        def step(index):
            x, y = batches[index % DISTINCT_BATCHES]
            optimizer.zero_grad(set_to_none=False)
            loss_fn(ddp(Tensor(x)), y).backward()
            optimizer.step()
    else:
        optimizer = optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        coordinated = CoordinatorDataParallel(model, optimizer)

        def step(index):
            x, y = batches[index % DISTINCT_BATCHES]
            optimizer.zero_grad()
            loss_fn(model(Tensor(x)), y).backward()
            coordinated.step(batch_size=len(x))

    return timed_windows(step, dist.barrier, warmup, windows, steps)


def run_minidist(model_name, flavour, world_size, warmup, windows, steps) -> list[float]:
    import minidist

    per_rank = minidist.launch(minidist_worker, world_size=world_size, transport="shm",
                               args=(model_name, flavour, warmup, windows, steps), timeout=600)
    return [max(times) for times in zip(*per_rank)]


# ------------------------------------------------------------------ PyTorch
def torch_worker(rank, world_size, rendezvous, model_name, warmup, windows, steps, results):
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"
    import torch
    import torch.distributed as tdist

    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                             world_size=world_size)
    torch.manual_seed(0)
    nn = torch.nn
    if model_name == "mlp":
        model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                              nn.Linear(512, 10))
    else:
        model = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 7 * 7, 10),
        )
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = nn.CrossEntropyLoss()
    batches = [(torch.from_numpy(x), torch.from_numpy(y))
               for x, y in rank_batches(model_name, rank, world_size)]

    def step(index):
        x, y = batches[index % DISTINCT_BATCHES]
        optimizer.zero_grad()
        loss_fn(ddp(x), y).backward()
        optimizer.step()

    times = timed_windows(step, tdist.barrier, warmup, windows, steps)
    results.put((rank, times))
    tdist.destroy_process_group()


def run_torch(model_name, world_size, warmup, windows, steps) -> list[float]:
    from minidist.bench.common import spawn_torch_ranks

    per_rank = spawn_torch_ranks(torch_worker, world_size, model_name, warmup, windows, steps)
    return [max(times) for times in zip(*(per_rank[r] for r in range(world_size)))]


# ------------------------------------------------------------------- driver
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 1 and 2 workers, few steps")
    parser.add_argument("--workers", default=None,
                        help="comma-separated world sizes (default 1,2,4; quick: 1,2)")
    parser.add_argument("--models", default="mlp,cnn", help="mlp, cnn or both (default)")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per timed window (default 20; quick: 5)")
    parser.add_argument("--windows", type=int, default=None,
                        help="timed windows, the median is kept (default 5; quick: 2)")
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch DDP")
    parser.add_argument("--json", default=os.path.join(HERE, "results", "data_parallel.json"),
                        help="where to write the results")
    args = parser.parse_args(argv)
    worlds = [int(n) for n in (args.workers or ("1,2" if args.quick else "1,2,4")).split(",")]
    if 1 not in worlds:
        worlds = [1] + worlds  # efficiency is measured against one worker
    models = [name.strip() for name in args.models.split(",")]
    for name in models:
        if name not in BATCH:
            parser.error(f"unknown model {name!r}: choose from {', '.join(BATCH)}")
    steps = args.steps or (5 if args.quick else 20)
    windows = args.windows or (2 if args.quick else 5)
    warmup = 2 if args.quick else 5

    from rich.console import Console
    from rich.table import Table

    from minidist.bench.common import machine

    console = Console(highlight=False, width=max(Console().width, 130))
    have_torch = not args.no_torch and importlib.util.find_spec("torch") is not None
    torch_version = None
    if have_torch:
        torch_version = importlib.metadata.version("torch")
    elif not args.no_torch:
        console.print("PyTorch is not installed: its column is left out "
                      "(pip install torch to get it)")

    runners = {"independent": lambda m, n: run_minidist(m, "independent", n, warmup, windows,
                                                        steps),
               "ddp": lambda m, n: run_minidist(m, "ddp", n, warmup, windows, steps),
               "coordinator": lambda m, n: run_minidist(m, "coordinator", n, warmup, windows,
                                                        steps)}
    if have_torch:
        runners["torch"] = lambda m, n: run_torch(m, n, warmup, windows, steps)

    results = []
    for model_name in models:
        single = {}
        for world_size in worlds:
            row = {"model": model_name, "workers": world_size,
                   "batch_per_worker": BATCH[model_name]}
            for flavour, run in runners.items():
                console.print(f"{model_name}, {world_size} worker(s), {flavour} ...", end=" ")
                step_time = statistics.median(run(model_name, world_size)) / steps
                samples = world_size * BATCH[model_name] / step_time
                if world_size == 1:
                    single[flavour] = samples
                row[f"{flavour}_step_ms"] = step_time * 1e3
                row[f"{flavour}_samples_per_s"] = samples
                row[f"{flavour}_efficiency"] = samples / (world_size * single[flavour])
                console.print(f"{step_time * 1e3:.2f} ms/step")
            row["ddp_over_torch"] = (row["ddp_step_ms"] / row["torch_step_ms"]
                                     if have_torch else None)
            results.append(row)

    table = Table(title=f"weak scaling, 1 BLAS thread per worker, median of {windows} windows "
                        f"of {steps} steps" + (f", PyTorch {torch_version}" if have_torch else ""))
    columns = ["model", "n", "independent\neff.", "DDP\nsamples/s", "DDP\neff.", "coordinator\nsamples/s",
               "coordinator\neff."]
    if have_torch:
        columns += ["PyTorch\nsamples/s", "PyTorch\neff.", "DDP /\nPyTorch"]
    for column in columns:
        table.add_column(column, justify="left" if column == "model" else "right")
    for row in results:
        cells = [f"{row['model']} b={row['batch_per_worker']}", str(row["workers"]),
                 f"{row['independent_efficiency'] * 100:.0f} %"]
        for flavour in ("ddp", "coordinator") + (("torch",) if have_torch else ()):
            cells += [f"{row[f'{flavour}_samples_per_s']:,.0f}",
                      f"{row[f'{flavour}_efficiency'] * 100:.0f} %"]
        if have_torch:
            cells.append(f"{row['ddp_over_torch']:.2f}x")
        table.add_row(*cells)
    console.print(table)
    cores = machine()["cores"]
    if max(worlds) > cores:
        console.print(f"n > {cores} (the cores here): those ranks take turns on the CPU.")

    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump({"benchmark": "data_parallel weak scaling", "machine": machine(),
                       "torch": torch_version, "quick": args.quick,
                       "settings": {"steps": steps, "windows": windows, "warmup": warmup,
                                    "batch_per_worker": BATCH, "lr": LR, "momentum": MOMENTUM,
                                    "data": "bundled digits upscaled to 28x28 (784 pixels)",
                                    "blas_threads_per_worker": 1},
                       "results": results}, handle, indent=2)
        console.print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
