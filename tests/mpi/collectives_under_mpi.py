"""Every collective x algorithm on the mpi transport, checked against NumPy.

Run by mpiexec (tests/mpi/test_mpi.py starts it with -n 2, 3 and 4)::

    mpiexec -n 4 python tests/mpi/collectives_under_mpi.py

Each rank builds every rank's input from a seed, so it can compute the NumPy
reference of its own result without asking anyone. Sizes: 0, 1, fewer
elements than ranks, not divisible by the world, and one large enough
(~1 MiB) that MPI switches from eager sends to rendezvous; dtypes float64
and int32; ops sum and max (and avg for all_reduce); roots 0 and the last
rank. A few point-to-point checks of the transport contract come first;
last, one strategy on top of them: FSDP of a GPT whose token embedding is
its output layer (one Parameter in two layers), each sharding strategy,
against one process's training (atol 1e-6, as tests/parallel/test_fsdp_tied.py).
Exits 1 (after every case ran) when any result is wrong; an exception in a
rank ends the job through MPI_Abort, with that rank named.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import minidist.distributed as dist
from minidist import Tensor, nn, optim
from minidist.distributed import world as _world
from minidist.distributed.collectives.registry import ALGORITHMS
from minidist.models.gpt import GPT, GPTConfig
from minidist.parallel.data.fsdp import STRATEGIES, FullyShardedDataParallel

DTYPES = ("float64", "int32")
OPS = ("sum", "max")
LARGE = (1 << 17) + 5


def names(collective: str) -> list[str]:
    """The course's algorithms of ``collective``, then MPI's own ("native")."""
    return list(ALGORITHMS[collective]) + ["native"]


def sizes(n: int) -> list[int]:
    return sorted({0, 1, max(n - 1, 1), 7 * n + 3, LARGE})


def make(rank: int, count: int, dtype: str, salt: int) -> np.ndarray:
    rng = np.random.default_rng([rank, count, salt, np.dtype(dtype).itemsize])
    if dtype.startswith("int"):
        return rng.integers(-50, 50, count).astype(dtype)
    return (rng.standard_normal(count) * 4).astype(dtype)


def combine(arrays, op: str, dtype: str) -> np.ndarray:
    wide = np.stack([a.astype(np.float64) for a in arrays]) if arrays[0].size else \
        np.zeros((len(arrays), 0))
    if op in ("sum", "avg"):
        out = wide.sum(axis=0)
        if op == "avg":
            out = out / len(arrays)
    else:
        out = wide.max(axis=0)
    return out


class Checker:
    def __init__(self, rank: int, n: int):
        self.rank, self.n = rank, n
        self.cases = 0
        self.failures: list[str] = []

    def check(self, what: str, got: np.ndarray, expected, dtype: str) -> None:
        self.cases += 1
        got = np.asarray(got)
        expected = np.asarray(expected, np.float64).reshape(-1)
        if got.dtype != np.dtype(dtype):
            self.failures.append(f"{what}: dtype {got.dtype}, expected {dtype}")
            return
        got = got.astype(np.float64).reshape(-1)
        if got.shape != expected.shape:
            self.failures.append(f"{what}: shape {got.shape}, expected {expected.shape}")
            return
        exact = np.dtype(dtype).kind in "iu"
        ok = np.array_equal(got, expected) if exact else np.allclose(got, expected, rtol=1e-9,
                                                                      atol=1e-9)
        if not ok:
            bad = np.flatnonzero(~np.isclose(got, expected, rtol=1e-9, atol=1e-9))
            self.failures.append(f"{what}: {bad.size} wrong elements, first at {bad[:3]}: "
                                 f"got {got[bad[:3]]}, expected {expected[bad[:3]]}")


def point_to_point(c: Checker) -> None:
    rank, n = c.rank, c.n
    # Order per (source, tag), receiving a later tag first (the unexpected path).
    if rank == 0:
        for tag in (5, 7, 5):
            dist.send(np.full(3, tag + 0.5), dst=1, tag=tag)
    elif rank == 1:
        seven, first, second = np.empty(3), np.empty(3), np.empty(3)
        dist.recv(seven, src=0, tag=7)
        dist.recv(first, src=0, tag=5)
        dist.recv(second, src=0, tag=5)
        c.check("p2p tag order", np.concatenate([seven, first, second]),
                [7.5] * 3 + [5.5] * 6, "float64")
    # ANY_SOURCE, probe, recv_reduce, non-contiguous send, 0-d and empty arrays.
    if rank != 0:
        dist.send(np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2] * rank, dst=0, tag=1)
        dist.send(np.array(rank, np.int64), dst=0, tag=2)
        dist.send(np.empty((0, 4), np.float32), dst=0, tag=3)
    else:
        total = np.zeros((3, 2), np.int32)
        for _ in range(n - 1):
            info = dist.probe(src=None, tag=1)
            if info.shape != (3, 2):
                c.failures.append(f"probe reported shape {info.shape}")
            dist.recv_reduce(total, src=info.source, tag=1)
        c.check("p2p recv_reduce", total,
                np.arange(12).reshape(3, 4)[:, ::2] * sum(range(1, n)), "int32")
        zero_d = [int(dist.recv_array(src=r, tag=2)) for r in range(1, n)]
        c.check("p2p 0-d", np.array(zero_d, np.int64), list(range(1, n)), "int64")
        for r in range(1, n):
            empty = dist.recv_array(src=r, tag=3)
            c.check("p2p empty", empty, np.empty(0), "float32")
    # isend / irecv handles both ways at once (a ring), big enough for rendezvous.
    right, left = (rank + 1) % n, (rank - 1) % n
    out = make(rank, LARGE, "float64", 99)
    into = np.empty(LARGE)
    requests = [dist.isend(out, dst=right, tag=9), dist.irecv(into, src=left, tag=9)]
    for request in requests:
        request.wait()
    c.check("p2p ring isend/irecv", into, make(left, LARGE, "float64", 99), "float64")


def collectives(c: Checker) -> None:
    rank, n = c.rank, c.n
    everyone = range(n)
    for count in sizes(n):
        for dtype in DTYPES:
            for root in sorted({0, n - 1}):
                salt = 1
                for algorithm in names("broadcast"):
                    array = make(rank, count, dtype, salt) if rank == root else \
                        np.zeros(count, dtype)
                    dist.broadcast(array, src=root, algorithm=algorithm)
                    c.check(f"broadcast/{algorithm} {count} {dtype} root {root}", array,
                            make(root, count, dtype, salt), dtype)
                for op in OPS:
                    for algorithm in names("reduce"):
                        array = make(rank, count, dtype, 2).copy()
                        dist.reduce(array, dst=root, op=op, algorithm=algorithm)
                        if rank == root:
                            c.check(f"reduce/{algorithm} {op} {count} {dtype} root {root}",
                                    array, combine([make(r, count, dtype, 2) for r in everyone],
                                                   op, dtype), dtype)
                for algorithm in names("scatter"):
                    pieces = [make(r, count, dtype, 3) for r in everyone] if rank == root \
                        else None
                    out = np.zeros(count, dtype)
                    dist.scatter(out, pieces, src=root, algorithm=algorithm)
                    c.check(f"scatter/{algorithm} {count} {dtype} root {root}", out,
                            make(rank, count, dtype, 3), dtype)
                for algorithm in names("gather"):
                    pieces = [np.zeros(count, dtype) for _ in everyone] if rank == root \
                        else None
                    dist.gather(make(rank, count, dtype, 4), pieces, dst=root,
                                algorithm=algorithm)
                    if rank == root:
                        c.check(f"gather/{algorithm} {count} {dtype} root {root}",
                                np.concatenate(pieces),
                                np.concatenate([make(r, count, dtype, 4) for r in everyone]),
                                dtype)
            for op in OPS + (("avg",) if dtype.startswith("float") else ()):
                for algorithm in names("all_reduce"):
                    array = make(rank, count, dtype, 5).copy()
                    dist.all_reduce(array, op=op, algorithm=algorithm)
                    c.check(f"all_reduce/{algorithm} {op} {count} {dtype}", array,
                            combine([make(r, count, dtype, 5) for r in everyone], op, dtype),
                            dtype)
            for op in OPS:
                for algorithm in names("reduce_scatter"):
                    out = np.zeros(count, dtype)
                    dist.reduce_scatter_tensor(out, make(rank, n * count, dtype, 6), op=op,
                                               algorithm=algorithm)
                    full = combine([make(r, n * count, dtype, 6) for r in everyone], op, dtype)
                    c.check(f"reduce_scatter/{algorithm} {op} {count} {dtype}", out,
                            full[rank * count:(rank + 1) * count], dtype)
            for algorithm in names("all_gather"):
                parts = [np.zeros(count, dtype) for _ in everyone]
                dist.all_gather(parts, make(rank, count, dtype, 7), algorithm=algorithm)
                c.check(f"all_gather/{algorithm} {count} {dtype}", np.concatenate(parts),
                        np.concatenate([make(r, count, dtype, 7) for r in everyone]), dtype)
            for algorithm in names("all_to_all"):
                source = make(rank, n * count, dtype, 8)
                out = np.zeros(n * count, dtype)
                dist.all_to_all_single(out, source, algorithm=algorithm)
                c.check(f"all_to_all/{algorithm} {count} {dtype}", out,
                        np.concatenate([make(r, n * count, dtype, 8)[rank * count:
                                                                     (rank + 1) * count]
                                        for r in everyone]), dtype)
    for algorithm in names("barrier"):
        for _ in range(3):
            dist.barrier(algorithm=algorithm)
        c.cases += 1


def native_extras(c: Checker) -> None:
    """algorithm="native" on a subgroup, with async_op, and beside a ring."""
    rank, n = c.rank, c.n
    members = list(range(1, n)) if n > 2 else [0, 1]
    group = dist.new_group(members)
    if rank in members:
        array = np.full(5, float(rank))
        dist.all_reduce(array, group=group, algorithm="native")
        c.check("native all_reduce on a subgroup", array, [float(sum(members))] * 5,
                "float64")
        last = np.array([rank], np.int32) if rank == members[-1] else np.zeros(1, np.int32)
        dist.broadcast(last, src=members[-1], group=group, algorithm="native")
        c.check("native broadcast on a subgroup", last, [members[-1]], "int32")
    work = dist.all_reduce(np.ones(3), algorithm="native", async_op=True)
    work.wait()
    ring, mpis = make(rank, 1000, "float64", 11), make(rank, 1000, "float64", 11)
    dist.all_reduce(ring, algorithm="ring")
    dist.all_reduce(mpis, algorithm="native")
    c.check("ring and native agree", ring, mpis, "float64")


def fsdp_tied_gpt(c: Checker) -> None:
    """FSDP(GPT) with its tied embedding, each strategy: the weights of one
    process's training on the whole batch (every rank trains it, to compare),
    and the tie kept."""
    config = GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8)
    tokens = np.random.default_rng(7).integers(0, config.vocab_size, (3, 2 * c.n, 9))

    def train(wrap, rows):
        model = GPT(config, rng=0)
        wrapped = wrap(model)
        optimizer = optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9)
        for batch in tokens[:, rows]:
            optimizer.zero_grad()
            logits = wrapped(Tensor(batch[:, :-1]))
            nn.CrossEntropyLoss()(logits.reshape(-1, config.vocab_size),
                                  batch[:, 1:].reshape(-1)).backward()
            optimizer.step()
        return model, wrapped

    reference, _ = train(lambda model: model, slice(None))
    expected = [p.data for p in reference.parameters()]
    for strategy in STRATEGIES:
        model, fsdp = train(lambda m, s=strategy: FullyShardedDataParallel(m, sharding_strategy=s),
                            slice(2 * c.rank, 2 * c.rank + 2))
        got = fsdp.full_weights()
        c.cases += 1
        if model.lm_head.weight is not model.transformer.wte.weight or len(got) != len(expected):
            c.failures.append(f"fsdp {strategy} tied GPT: the tie or the parameters were lost")
            continue
        worst = max(float(np.abs(a - b).max()) for a, b in zip(got, expected))
        if worst > 1e-6:
            c.failures.append(f"fsdp {strategy} tied GPT: weights {worst:.2e} from one "
                              "process's training (atol 1e-6)")


def main() -> int:
    start = time.perf_counter()
    dist.init_process_group()
    rank, n = dist.get_rank(), dist.get_world_size()
    transport = _world.current().transport.name
    if transport != "mpi":
        print(f"rank {rank}: expected the mpi transport, got {transport!r}", file=sys.stderr)
        return 1
    checker = Checker(rank, n)
    point_to_point(checker)
    collectives(checker)
    native_extras(checker)
    fsdp_tied_gpt(checker)
    algorithms = sum(len(names) for names in ALGORITHMS.values())
    for failure in checker.failures[:20]:
        print(f"rank {rank}: FAIL {failure}", flush=True)
    flag = np.array([len(checker.failures)], np.int64)
    dist.all_reduce(flag)
    if rank == 0:
        print(f"mpi transport, {n} ranks: {algorithms} algorithms and MPI's own, {checker.cases} checks on "
              f"rank 0, {int(flag[0])} failures over all ranks, "
              f"{time.perf_counter() - start:.1f} s", flush=True)
    return 1 if flag[0] else 0


if __name__ == "__main__":
    sys.exit(main())
