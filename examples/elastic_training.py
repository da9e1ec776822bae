"""DDP that survives a killed rank: elastic restarts and a resumable checkpoint.

    minidist run --max-restarts 2 -n 2:4 examples/elastic_training.py --kill-rank 1 --kill-step 23
    minidist run --max-restarts 2 -n 2:4 examples/elastic_training.py --kill-rank 1 --kill-step 23 --fault lost

A small MLP (float64) learns a synthetic regression with DDP. Every
``--every`` steps an :class:`~minidist.parallel.resilience.ElasticCheckpointer`
saves model, momentum and step; the batches come from a
:class:`~minidist.parallel.resilience.GlobalBatchSampler`, so step ``s``
trains on the same global batch whatever the world size. On the first
attempt rank ``--kill-rank`` fails at ``--kill-step`` (``--fault``: SIGKILL,
``exit0``: ``os._exit(0)``, ``raise``, ``sigstop``, ``lost``: marks its slot
lost and is killed, so the next attempt has one rank fewer; ``save``: killed
in the middle of the checkpoint of that step, on a rank that writes one:
rank 0, as dcp writes a replicated array once, by its lowest rank). ``minidist run`` ends every
rank, starts them again, and the script resumes from the latest checkpoint
("resumed at step 20 from checkpoint of step 20; 3 steps lost").

At the end rank 0 prints the weights' checksum and trains the same steps in
this process, unbroken and without DDP, and says whether the weights agree
(up to float rounding: one process sums the batch's gradients in another
order than the ranks' all_reduce).
"""

import argparse
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time

import numpy as np

import minidist.distributed as dist
from minidist import Tensor, nn, optim
from minidist.parallel.data import DistributedDataParallel
from minidist.parallel.resilience import ElasticCheckpointer, GlobalBatchSampler
from minidist.runtime import restarts

FAULTS = ("sigkill", "exit0", "raise", "sigstop", "lost", "exit69", "save")


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    parser.add_argument("--global-batch", type=int, default=12)
    parser.add_argument("--width", type=int, default=16, help="hidden width of the MLP")
    parser.add_argument("--kill-rank", type=int, default=None)
    parser.add_argument("--kill-step", type=int, default=None)
    parser.add_argument("--fault", choices=FAULTS, default="sigkill")
    parser.add_argument("--checkpoint-dir", default=None,
                        help="default: inside the run's folder (gone when the run ends)")
    parser.add_argument("--out", default=None, help="rank 0 writes the final weights here (.npz)")
    parser.add_argument("--times", default=None,
                        help="append when the fault struck and each attempt's first step ended")
    return parser.parse_args(argv)


def build(width: int):
    rng = np.random.default_rng(0)
    model = nn.Sequential(nn.Linear(8, width, rng=rng, dtype=np.float64), nn.Tanh(),
                          nn.Linear(width, 1, rng=rng, dtype=np.float64))
    return model, optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def data(n: int = 480):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n, 8))
    return x, np.sin(x @ rng.normal(size=(8, 1)))


def train_step(model, optimizer, x, y) -> float:
    optimizer.zero_grad()
    loss = nn.MSELoss()(model(Tensor(x)), Tensor(y))
    loss.backward()
    optimizer.step()
    return float(loss.data)


def weights(model) -> dict:
    return {name: np.array(p.data) for name, p in model.named_parameters()}


def checksum(named: dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(named):
        digest.update(np.ascontiguousarray(named[name]).tobytes())
    return digest.hexdigest()[:16]


def unbroken(args) -> dict:
    """The same steps in one process: the global batch whole, no DDP."""
    model, optimizer = build(args.width)
    x, y = data()
    sampler = GlobalBatchSampler(len(x), args.global_batch)
    for step in range(args.steps):
        idx = sampler.global_indices(step)
        train_step(model, optimizer, x[idx], y[idx])
    return weights(model)


def note(path, **fields) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps(dict(fields, t=time.monotonic_ns())) + "\n")


def strike(args, rank: int) -> None:
    """The fault of the first attempt, on this rank."""
    note(args.times, event="fault", rank=rank, fault=args.fault)
    if args.fault == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if args.fault == "exit0":
        os._exit(0)
    if args.fault == "raise":
        raise RuntimeError(f"injected fault on rank {rank} at step {args.kill_step}")
    if args.fault == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    if args.fault == "lost":
        restarts.mark_rank_lost()
        os.kill(os.getpid(), signal.SIGKILL)
    if args.fault == "exit69":
        os._exit(restarts.LOST_EXIT_CODE)


def kill_inside_next_save(args, rank: int) -> None:
    """Die after writing the first bytes of the next checkpoint (the seam
    dcp's save offers for failure injection)."""
    save_module = sys.modules["minidist.distributed.checkpoint.save"]
    write_bytes = save_module.write_bytes

    def dying_write(file, payload, key):
        write_bytes(file, payload, key)
        file.flush()
        note(args.times, event="fault", rank=rank, fault="save")
        os.kill(os.getpid(), signal.SIGKILL)

    save_module.write_bytes = dying_write


def main(argv=None) -> None:
    args = parse(argv)
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = restarts.restart_count()
    # The same folder on every rank: the run's own under --max-restarts (gone
    # when the run ends), else one named after the launcher (this rank's parent).
    scratch = os.path.join(tempfile.gettempdir(), f"elastic-training-{os.getppid()}")
    folder = args.checkpoint_dir or os.path.join(
        os.environ.get(restarts.ELASTIC_DIR) or scratch, "checkpoints")
    model, optimizer = build(args.width)
    ddp = DistributedDataParallel(model)
    x, y = data()
    sampler = GlobalBatchSampler(len(x), args.global_batch)
    checkpointer = ElasticCheckpointer(folder, model, optimizer, every=args.every,
                                       extra={"sampler": sampler.state_dict()})
    note(args.times, event="start", attempt=attempt, rank=rank, pid=os.getpid())
    start = checkpointer.resume()
    if rank == 0:
        print(f"attempt {attempt + 1} (restart {attempt}) on {world} ranks: "
              f"{checkpointer.report.text()}", flush=True)
    faulty = attempt == 0 and rank == args.kill_rank and args.kill_step is not None
    for step in range(start, args.steps):
        if faulty and step == args.kill_step and args.fault != "save":
            strike(args, rank)
        if faulty and step + 1 == args.kill_step and args.fault == "save":
            kill_inside_next_save(args, rank)
        idx = sampler.local_batch(step, rank, world)
        train_step(ddp, optimizer, x[idx], y[idx])
        checkpointer.step_done(step + 1)
        if step == start and rank == 0:
            note(args.times, event="first_step", attempt=attempt, step=step)
    if rank == 0:
        final = weights(model)
        reference = unbroken(args)
        worst = max(float(np.max(np.abs(final[k] - reference[k]) /
                                 np.maximum(np.abs(reference[k]), 1e-300))) for k in final)
        same = all(np.allclose(final[k], reference[k], rtol=1e-9, atol=0) for k in final)
        print(f"final weights: checksum {checksum(final)}; an unbroken run in one process: "
              f"{checksum(reference)}; equal within rtol 1e-9: {'yes' if same else 'NO'} "
              f"(largest relative difference {worst:.1e})", flush=True)
        if args.out:
            np.savez(args.out, **final)
    dist.barrier()  # every rank done with the folder before it goes
    if rank == 0 and not args.checkpoint_dir and os.path.isdir(scratch):
        shutil.rmtree(scratch, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
