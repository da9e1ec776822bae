"""CuPy across processes, run in a fresh Python by tests/gpu/test_gpu_distributed.py.

CUDA must not be initialized in a process that forks workers which use it,
so the parent here never touches CuPy: each worker selects the backend itself.

Part 1: every collective and point-to-point call on CuPy arrays (staged
through host memory) on the pipe and shm transports, 2 and 3 ranks, checked
against NumPy; results stay CuPy arrays. Part 2: DDP training of the digits
CNN on the GPU against the same run on NumPy (same seeds: the weights agree
after an epoch), then its test accuracy after a few epochs.
"""

from __future__ import annotations

import sys

import numpy as np

import minidist


def collectives_on_cupy():
    import cupy

    import minidist.distributed as dist
    from minidist import backend

    backend.use("cupy")
    rank, n = dist.get_rank(), dist.get_world_size()
    failures = []

    def check(what, got, expected):
        if type(got).__module__.split(".")[0] != "cupy":
            failures.append(f"{what}: result is a {type(got).__name__}, not a CuPy array")
            return
        if not np.allclose(cupy.asnumpy(got), expected):
            failures.append(f"{what}: {cupy.asnumpy(got)[:4]} != {np.asarray(expected)[:4]}")

    def base(r, count=10):
        return np.arange(count, dtype=np.float32) + 100 * r

    everyone = sum(base(r) for r in range(n))
    for algorithm in ("ring", "auto"):
        x = cupy.asarray(base(rank))
        dist.all_reduce(x, algorithm=algorithm)
        check(f"all_reduce {algorithm}", x, everyone)
    x = cupy.asarray(base(rank))
    dist.all_reduce(x, op="avg")
    check("all_reduce avg", x, everyone / n)
    x = cupy.asarray(base(rank)[::2].copy())
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    check("all_reduce async", x, everyone[::2])
    strided = cupy.asarray(np.stack([base(rank), base(rank)]))[:, ::2]
    dist.all_reduce(strided)
    check("all_reduce strided view", strided, np.stack([everyone, everyone])[:, ::2])
    x = cupy.asarray(base(rank))
    dist.broadcast(x, src=n - 1)
    check("broadcast", x, base(n - 1))
    x = cupy.asarray(base(rank))
    dist.reduce(x, dst=0)
    if rank == 0:
        check("reduce", x, everyone)
    parts = [cupy.zeros(10, cupy.float32) for _ in range(n)]
    dist.all_gather(parts, cupy.asarray(base(rank)))
    check("all_gather", cupy.concatenate(parts), np.concatenate([base(r) for r in range(n)]))
    out = cupy.zeros(10 * n, cupy.float32)
    dist.all_gather_into_tensor(out, cupy.asarray(base(rank)))
    check("all_gather_into_tensor", out, np.concatenate([base(r) for r in range(n)]))
    out = cupy.zeros(10, cupy.float32)
    dist.reduce_scatter_tensor(out, cupy.asarray(base(rank, 10 * n)))
    check("reduce_scatter_tensor", out,
          sum(base(r, 10 * n) for r in range(n))[rank * 10:(rank + 1) * 10])
    out = cupy.zeros(10 * n, cupy.float32)
    dist.all_to_all_single(out, cupy.asarray(base(rank, 10 * n)))
    check("all_to_all_single", out,
          np.concatenate([base(r, 10 * n)[rank * 10:(rank + 1) * 10] for r in range(n)]))
    gathered = [cupy.zeros(10, cupy.float32) for _ in range(n)] if rank == 0 else None
    dist.gather(cupy.asarray(base(rank)), gathered, dst=0)
    if rank == 0:
        check("gather", cupy.concatenate(gathered), np.concatenate([base(r) for r in range(n)]))
    out = cupy.zeros(10, cupy.float32)
    dist.scatter(out, [cupy.asarray(base(r)) for r in range(n)] if rank == 0 else None, src=0)
    check("scatter", out, base(rank))
    right, left = (rank + 1) % n, (rank - 1) % n
    into = cupy.zeros(10, cupy.float32)
    requests = [dist.isend(cupy.asarray(base(rank)), dst=right), dist.irecv(into, src=left)]
    for request in requests:
        request.wait()
    check("isend/irecv ring", into, base(left))
    if rank == 0:
        dist.send(cupy.asarray(base(7)), dst=1)
    elif rank == 1:
        into = cupy.zeros(10, cupy.float32)
        dist.recv(into, src=0)
        check("send/recv", into, base(7))
    return failures


def ddp_digits(backend_name: str, epochs: int):
    import minidist.distributed as dist
    from minidist import Tensor, backend, nn, optim
    from minidist.data import load_digits
    from minidist.parallel import DistributedDataParallel
    from minidist.train import build_model, evaluate

    backend.use(backend_name)
    rank, n = dist.get_rank(), dist.get_world_size()
    x_train, y_train, x_test, y_test = load_digits(flatten=False)
    model = build_model("cnn", seed=0)
    ddp = DistributedDataParallel(model)
    optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    batch = 64
    rng = np.random.default_rng(0)
    for _ in range(epochs):
        order = rng.permutation(len(x_train))
        for start in range(0, len(order) - batch + 1, batch):
            mine = order[start:start + batch][rank::n]
            xb = backend.get().asarray(x_train[mine])
            loss = loss_fn(ddp(Tensor(xb)), y_train[mine])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    kinds = {type(p.data).__module__.split(".")[0] for p in model.parameters()}
    return (evaluate(model, x_test, y_test), [backend.to_numpy(p.data) for p in model.parameters()],
            sorted(kinds))


def main() -> int:
    failures = []
    for transport in ("pipe", "shm"):
        for ranks in (2, 3):
            for rank_failures in minidist.launch(collectives_on_cupy, world_size=ranks,
                                                 transport=transport):
                failures += [f"{transport} {ranks} ranks: {f}" for f in rank_failures]
    print(f"collectives on CuPy arrays: {len(failures)} failures", flush=True)
    for failure in failures[:20]:
        print("FAIL", failure)
    cpu = minidist.launch(ddp_digits, world_size=2, args=("numpy", 1))
    gpu = minidist.launch(ddp_digits, world_size=2, args=("cupy", 1))
    worst = max(float(np.max(np.abs(a - b))) for a, b in zip(cpu[0][1], gpu[0][1]))
    same_ranks = all(np.array_equal(a, b) for a, b in zip(gpu[0][1], gpu[1][1]))
    print(f"DDP digits CNN, 1 epoch, 2 ranks: kinds {gpu[0][2]}, largest weight difference "
          f"GPU vs NumPy {worst:.2e}, ranks identical {same_ranks}", flush=True)
    ok = gpu[0][2] == ["cupy"] and worst < 1e-3 and same_ranks
    trained = minidist.launch(ddp_digits, world_size=2, args=("cupy", 6))
    print(f"DDP digits CNN on the GPU, 6 epochs: test accuracy {100 * trained[0][0]:.2f} %",
          flush=True)
    ok = ok and trained[0][0] > 0.93 and not failures
    print("GPU END TO END: " + ("PASSED" if ok else "FAILED"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
