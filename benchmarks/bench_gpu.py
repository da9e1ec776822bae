"""The CuPy backend against NumPy, on a machine with an NVIDIA GPU.

    python benchmarks/bench_gpu.py            # needs CuPy and a CUDA device

All in one run, interleaved (NumPy, CuPy, NumPy, ...) and repeated; medians:

* a training step (forward, backward, SGD) of Dettmers' layer ("Model
  Parallelism in Deep Learning", 2014), 1000 -> 500, at batch 128, and of
  an MLP 1000-2048-2048-10 at batch 512;
* a training step of the digits CNN at batch 64 (tiny: kernel launches
  dominate), and of a wider CNN (3x32x32 inputs, 64 channels) at batch 128;
* an all_reduce of 64 MiB between 2 ranks on shm, of a NumPy array and of a
  CuPy array (staged through host memory: the copies' cost);
* DDP training of the digits CNN, 2 ranks on shm, one epoch (after a first,
  warming one: CUDA context, kernels compiled), NumPy vs CuPy.

Writes benchmarks/results/gpu.json. The GPU work is synchronized before each
clock reading (cupy.cuda.Device().synchronize()).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def _sync(name):
    if name == "cupy":
        import cupy

        cupy.cuda.Device().synchronize()


def step_time(name, make_model, shape, classes, steps):
    from minidist import Tensor, backend, nn, optim

    backend.use(name)
    try:
        xp = backend.get()
        model = make_model()
        optimizer = optim.SGD(model.parameters(), lr=0.01)
        loss_fn = nn.CrossEntropyLoss()
        rng = np.random.default_rng(0)
        x = xp.asarray(rng.random(shape, dtype=np.float32))
        y = rng.integers(0, classes, shape[0])

        def one():
            loss = loss_fn(model(Tensor(x)), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        one()
        one()
        _sync(name)
        start = time.perf_counter()
        for _ in range(steps):
            one()
        _sync(name)
        return (time.perf_counter() - start) / steps
    finally:
        backend.use("numpy")


def _all_reduce_worker(name, nbytes, calls):
    import minidist.distributed as dist
    from minidist import backend

    backend.use(name)
    xp = backend.get()
    array = xp.ones(nbytes // 4, xp.float32)
    dist.all_reduce(array)
    _sync(name)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(array)
    _sync(name)
    return (time.perf_counter() - start) / calls


def _ddp_epoch(name):
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "gpu"))
    from gpu_ranks import ddp_digits

    ddp_digits(name, 1)  # warm: the CUDA context, CuPy's kernels compiled on first use
    start = time.perf_counter()
    ddp_digits(name, 1)
    return time.perf_counter() - start


def main() -> int:
    import subprocess

    import minidist
    from minidist import nn

    # Asked in a child: CUDA initialized in this process would break the
    # workers it forks below (CUDA does not survive fork).
    probe = subprocess.run([sys.executable, "-c", "import cupy; "
                            "print(cupy.cuda.runtime.getDeviceCount())"],
                           capture_output=True, text=True)
    if probe.returncode != 0 or not probe.stdout.strip().isdigit() \
            or int(probe.stdout.strip()) < 1:
        print(f"bench_gpu: needs CuPy and a CUDA device ({probe.stderr.strip()[-300:]})",
              file=sys.stderr)
        return 2
    devices = int(probe.stdout.strip())
    rounds = int(os.environ.get("BENCH_ROUNDS", "5"))
    # The multi-process parts first: CUDA must not be initialized in this
    # process before it forks workers that use it.
    results = {"rounds": rounds, "cores": os.cpu_count()}
    reduce_times = {"numpy": [], "cupy": []}
    ddp_times = {"numpy": [], "cupy": []}
    for round_ in range(rounds):
        for name in (("numpy", "cupy") if round_ % 2 == 0 else ("cupy", "numpy")):
            reduce_times[name].append(max(minidist.launch(_all_reduce_worker, world_size=2,
                                                          args=(name, 64 << 20, 5))))
            if round_ < 3:
                ddp_times[name].append(max(minidist.launch(_ddp_epoch, world_size=2,
                                                           args=(name,))))
    results["all_reduce_64MiB_2ranks_s"] = {k: statistics.median(v)
                                            for k, v in reduce_times.items()}
    results["ddp_digits_cnn_epoch_2ranks_s"] = {k: statistics.median(v)
                                                for k, v in ddp_times.items()}
    cases = {
        "Dettmers' layer 1000->500, batch 128": (lambda: nn.Linear(1000, 500), (128, 1000), 500),
        "MLP 1000-2048-2048-10, batch 512": (
            lambda: nn.Sequential(nn.Linear(1000, 2048), nn.ReLU(), nn.Linear(2048, 2048),
                                  nn.ReLU(), nn.Linear(2048, 10)), (512, 1000), 10),
        "digits CNN, batch 64": (lambda: __import__("minidist.train", fromlist=["x"])
                                 .build_model("cnn", 0), (64, 1, 8, 8), 10),
        "CNN 3x32x32, 64 channels, batch 128": (
            lambda: nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Flatten(), nn.Linear(64 * 8 * 8, 10)),
            (128, 3, 32, 32), 10),
    }
    steps = {}
    for label, (make, shape, classes) in cases.items():
        times = {"numpy": [], "cupy": []}
        for round_ in range(rounds):
            for name in (("numpy", "cupy") if round_ % 2 == 0 else ("cupy", "numpy")):
                times[name].append(step_time(name, make, shape, classes, 5))
        steps[label] = {k: statistics.median(v) for k, v in times.items()}
    results["training_step_s"] = steps
    results["devices"] = devices
    print(f"CuPy vs NumPy, median of {rounds} interleaved rounds ({os.cpu_count()} cores)")
    print(f"{'what':<42} {'NumPy':>10} {'CuPy':>10} {'NumPy/CuPy':>11}")
    rows = dict(steps)
    rows["all_reduce 64 MiB, 2 ranks, shm"] = results["all_reduce_64MiB_2ranks_s"]
    rows["DDP digits CNN, 1 epoch, 2 ranks"] = results["ddp_digits_cnn_epoch_2ranks_s"]
    for label, t in rows.items():
        print(f"{label:<42} {t['numpy'] * 1e3:>8.2f}ms {t['cupy'] * 1e3:>8.2f}ms "
              f"{t['numpy'] / t['cupy']:>10.2f}x")
    out = os.environ.get("BENCH_OUT", os.path.join(HERE, "results", "gpu.json"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as file:
        json.dump(results, file, indent=1)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
