"""A character GPT trained on Shakespeare with 3D parallelism, and the bytes of each dimension.

    python examples/gpt_3d.py                          # pp2 x dp2 x tp2: 8 processes
    python examples/gpt_3d.py --mesh 2x1x2 --steps 5   # pp x dp x tp
    python examples/gpt_3d.py --schedule interleaved_1f1b --virtual-stages 2 --layers 4

1. Starts pp x dp x tp processes (``minidist.launch``, traced); each makes
   the mesh ``init_device_mesh("cpu", (pp, dp, tp), mesh_dim_names=("pp",
   "dp", "tp"))`` and a :class:`~minidist.parallel.mesh.gpt_3d.GPT3D` of the same
   seed: pipeline stages over pp, each stage tensor-parallel over tp,
   replicated over dp. Every rank draws the same global batches (one seed);
   each replica trains on its share. The last stage's ranks print the loss.
2. Trains the same GPT in this process on the same batches and prints the
   largest difference of the losses (float rounding: float64).
3. Reads the trace: the bytes sent along each mesh dimension (the timeline
   colours them the same way: ``minidist viz TRACE --timeline out.png``).

More ranks than cores is correct but slow (the ranks take turns).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

import minidist
from minidist import optim
from minidist.data import CharTokenizer, load_shakespeare
from minidist.data.text_windows import RandomWindows
from minidist.distributed.device_mesh import init_device_mesh, trace_header
from minidist.models.gpt import GPT, GPTConfig
from minidist.nn import functional as F
from minidist.parallel.mesh.gpt_3d import GPT3D, MESH_DIMS
from minidist.parallel.pipeline.executor import annotate_trace
from minidist.units import format_bytes
from viz.timeline import bytes_per_dimension


def batches(tokens, config, batch, steps):
    windows = RandomWindows(tokens, config.block_size, batch, seed=0)
    return [windows.sample() for _ in range(steps)]


def worker(shape, config, data, args):
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=MESH_DIMS)
    gpt = GPT3D(GPT(config, rng=0).to(np.float64), mesh, args.schedule, args.microbatches,
                virtual_stages=args.virtual_stages, sequence_parallel=args.sequence_parallel)
    optimizer = optim.AdamW(gpt.parameters(), lr=args.lr)
    losses = []
    for idx, targets in data:
        losses.append(gpt.step(idx, targets, optimizer))
    return losses


def one_process(config, data, lr):
    model = GPT(config, rng=0).to(np.float64)
    optimizer = optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for idx, targets in data:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(idx).reshape(-1, config.vocab_size), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mesh", default="2x2x2", help="pp x dp x tp, such as 2x2x2")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8, help="sequences per global batch")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--schedule", default="1f1b", choices=["1f1b", "interleaved_1f1b", "gpipe"])
    parser.add_argument("--virtual-stages", type=int, default=1)
    parser.add_argument("--microbatches", type=int, default=2)
    parser.add_argument("--sequence-parallel", action="store_true")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--trace", default=None, help="keep the trace here (default: a temporary file)")
    args = parser.parse_args()
    try:
        shape = tuple(int(n) for n in args.mesh.lower().split("x"))
        assert len(shape) == 3 and min(shape) >= 1
    except (ValueError, AssertionError):
        parser.error(f"--mesh {args.mesh!r}: give pp x dp x tp, such as 2x2x2")

    text = load_shakespeare()
    tokenizer = CharTokenizer(text)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layer=args.layers,
                       n_head=4, n_embd=32)
    data = batches(tokenizer.encode(text), config, args.batch, args.steps)
    world = int(np.prod(shape))
    path = args.trace or os.path.join(tempfile.mkdtemp(), "gpt_3d.jsonl")
    print(f"mesh pp x dp x tp = {' x '.join(map(str, shape))}: {world} processes, "
          f"schedule {args.schedule}, {args.microbatches} micro-batches")
    results = minidist.launch(worker, world_size=world, args=(shape, config, data, args),
                              trace=path, timeout=600)
    annotate_trace(path, trace_header(shape, MESH_DIMS))

    reference = one_process(config, data, args.lr)
    dp = shape[1]
    for step in range(args.steps):
        reported = [r[step] for r in results if r[step] is not None]
        # each last-stage rank reports its replica's mean; tp ranks repeat it
        loss = float(np.mean(reported))
        print(f"step {step}: loss {loss:.6f} (one process: {reference[step]:.6f})")
    gap = max(abs(float(np.mean([r[s] for r in results if r[s] is not None])) - reference[s])
              for s in range(args.steps))
    print(f"largest loss difference to one process: {gap:.1e} ({dp} replica(s) averaged)")
    print(f"bytes sent along each mesh dimension over {args.steps} steps (from the trace {path}):")
    for name, sent in bytes_per_dimension(path).items():
        print(f"  {name:>5}: {format_bytes(sent)}")


if __name__ == "__main__":
    main()
