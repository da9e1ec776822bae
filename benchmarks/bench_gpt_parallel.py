"""Bytes and time per training step of the GPT under DP, TP, SP, PP and their
products, at 2 and 4 processes.

Every configuration is a :class:`~minidist.parallel.gpt_3d.GPT3D` on a
``(pp, dp, tp)`` device mesh, so the strategies differ only in the mesh's
shape (and sequence parallelism, and the pipeline's schedule):

  2 ranks   DP 2, TP 2, TP+SP 2, PP 2 (1F1B), PP 2 (interleaved 1F1B, 2 chunks)
  4 ranks   DP 4, TP 4, PP 4, DP2xTP2, TP2xPP2, DP2xPP2, (and --with-8: DP2xTP2xPP2)

The model: the GPT of ``minidist train --model gpt`` narrowed (``--n-layer 4
--n-head 4 --n-embd 64 --block-size 32``, the 65 characters of the bundled
Shakespeare), global batch ``--batch 8`` cut into 2 micro-batches for the
pipelines, AdamW, float32, one BLAS thread per rank.

One traced launch per world size. In it each configuration first runs one
step inside a trace region (its bytes: every send of every rank inside that
region, attributed to the mesh dimension its two ranks differ in,
``viz.timeline.message_dimension``); then ``--windows`` rounds, in each of
which every configuration runs ``--steps`` steps after a barrier (the
configurations take turns, the order rotating from round to round). The
table gives the median over rounds of the slowest rank's time per step.

More ranks than cores runs correctly but the times then include the
scheduler's turns: read them against the machine's core count, printed.

Usage:  python benchmarks/bench_gpt_parallel.py [--worlds 2,4] [--steps 3 --windows 5]
                                                [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's minidist and viz, installed or not


#: name -> ((pp, dp, tp), schedule, virtual_stages, sequence_parallel), per world size
CONFIGS = {
    2: {"DP 2": ((1, 2, 1), "1f1b", 1, False),
        "TP 2": ((1, 1, 2), "1f1b", 1, False),
        "TP+SP 2": ((1, 1, 2), "1f1b", 1, True),
        "PP 2 1F1B": ((2, 1, 1), "1f1b", 1, False),
        "PP 2 interleaved": ((2, 1, 1), "interleaved_1f1b", 2, False)},
    4: {"DP 4": ((1, 4, 1), "1f1b", 1, False),
        "TP 4": ((1, 1, 4), "1f1b", 1, False),
        "PP 4 1F1B": ((4, 1, 1), "1f1b", 1, False),
        "DP2 x TP2": ((1, 2, 2), "1f1b", 1, False),
        "TP2 x PP2": ((2, 1, 2), "1f1b", 1, False),
        "DP2 x PP2": ((2, 2, 1), "1f1b", 1, False)},
    8: {"DP2 x TP2 x PP2": ((2, 2, 2), "1f1b", 1, False)},
}
DIMS = ("pp", "dp", "tp")


def worker(world, config, batches, steps, windows, lr):
    import minidist.distributed as dist
    from minidist import optim, trace
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.models.gpt import GPT
    from minidist.parallel.gpt_3d import GPT3D
    from minidist.runtime.blas_threads import set_blas_threads

    set_blas_threads(1)
    runs = {}
    for name, (shape, schedule, virtual, sp) in CONFIGS[world].items():
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=DIMS)
        gpt = GPT3D(GPT(config, rng=0), mesh, schedule, microbatches=2,
                    virtual_stages=virtual, sequence_parallel=sp)
        runs[name] = (gpt, optim.AdamW(gpt.parameters(), lr=lr))
    for name, (gpt, optimizer) in runs.items():
        dist.barrier()
        with trace.region(f"bytes {name}"):
            gpt.step(*batches[0], optimizer)
    times = {name: [] for name in runs}
    names = list(runs)
    for window in range(windows):
        order = names[window % len(names):] + names[:window % len(names)]
        for name in order:
            gpt, optimizer = runs[name]
            dist.barrier()
            start = time.perf_counter()
            for step in range(steps):
                gpt.step(*batches[step % len(batches)], optimizer)
            times[name].append((time.perf_counter() - start) / steps)
    return times


def bytes_by_dimension(events, world):
    """{config: {dim: bytes sent by all ranks in its traced step}}."""
    from minidist import trace
    from viz.timeline import message_dimension

    regions = {}
    for event in events:
        if event["kind"] == "compute" and trace.label_text(event["label"]).startswith("bytes "):
            regions[trace.label_text(event["label"])[6:], event["rank"]] = (event["start"],
                                                                             event["end"])
    totals = {}
    for name, (shape, *_) in CONFIGS[world].items():
        sent = dict.fromkeys(DIMS, 0)
        for event in events:
            span = regions.get((name, event["rank"]))
            if event["kind"] == "send" and span and span[0] <= event["start"] <= span[1]:
                dim = message_dimension(event["rank"], event["peer"], shape, DIMS) or "other"
                sent[dim] = sent.get(dim, 0) + event["bytes"]
        totals[name] = sent
    return totals


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worlds", default="2,4", help="world sizes, of 2, 4, 8")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import minidist
    from minidist import trace
    from minidist.data import CharTokenizer, load_shakespeare
    from minidist.data.text_windows import RandomWindows
    from minidist.models.gpt import GPTConfig

    text = load_shakespeare()
    tokenizer = CharTokenizer(text)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=args.block_size,
                       n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd)
    windows = RandomWindows(tokenizer.encode(text), config.block_size, args.batch, seed=0)
    batches = [windows.sample() for _ in range(4)]
    print(f"GPT {config.n_layer} layers x width {config.n_embd}, {config.n_head} heads, context "
          f"{config.block_size}, batch {args.batch} (2 micro-batches in pipelines); "
          f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}")
    print(f"{'configuration':<18} {'step time':>10} {'pp bytes':>10} {'dp bytes':>10} "
          f"{'tp bytes':>10}   (bytes: all ranks, one step)")
    results = {}
    for world in (int(w) for w in args.worlds.split(",")):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, f"gpt_parallel_{world}.jsonl")
            per_rank = minidist.launch(worker, world_size=world, trace=path, timeout=1200,
                                       args=(world, config, batches, args.steps,
                                             args.windows, 3e-3))
            sent = bytes_by_dimension(trace.read_jsonl(path).events, world)
        for name in CONFIGS[world]:
            slowest = [max(rank[name][w] for rank in per_rank) for w in range(args.windows)]
            median = statistics.median(slowest)
            results[name] = {"world": world, "step_s": median, "bytes": sent[name]}
            print(f"{name:<18} {median * 1e3:>8.1f} ms "
                  + " ".join(f"{sent[name][d]:>10,}" for d in DIMS))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"config": vars(args), "cores": os.cpu_count(), "results": results},
                      handle, indent=1)


if __name__ == "__main__":
    main()
