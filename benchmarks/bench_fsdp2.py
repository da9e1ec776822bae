"""FSDP2 (``fully_shard``) against FSDP1 (``FullyShardedDataParallel``) and
against torch's ``fully_shard`` on gloo: the GPT on 2 ranks, step time and
bytes sent per rank.

The model is the GPT of bench_gpt_parallel.py's default shape (4 layers, 4
heads, width 64, context 32, 62 characters, 8 sequences per rank), the same
initial weights on every side (minidist's ``GPT(config, rng=0)``, loaded into
bench_gpt.py's torch twin by name), AdamW lr 1e-3, float32, one BLAS thread
per process:

  FSDP2        minidist: fully_shard(block) for each block, then fully_shard(gpt)
  FSDP1        minidist: FullyShardedDataParallel(gpt, sharding_strategy=FULL_SHARD)
  torch FSDP2  torch.distributed.fsdp.fully_shard, the same calls, gloo, CPU

Both minidist flavours use ring collectives. A round is one minidist launch
(2 ranks, shm: each flavour runs ``--steps`` steps after a barrier, the order
rotating) then one torch spawn (2 processes, the same steps); the table gives
the median over ``--rounds`` rounds of the slowest rank's time per step, and
the median of each round's ratio to FSDP2's (a ratio of neighbours cancels
most of what other work does to both), with their ranges. The first loss of
each side is checked to agree.

Bytes: one traced minidist launch (one step of each flavour) gives the bytes
each rank sends per step, from the trace's send events; torch's are the
formula of the same layout (its all_gather and reduce_scatter pad each
parameter's dim 0 as minidist's FSDP2 does; gloo's own algorithm is not
traced). And the bytes of the shards each rank holds (FSDP2 per parameter,
FSDP1 one flat padded buffer per layer).

Usage:
  python benchmarks/bench_fsdp2.py [--rounds 9 --steps 10] [--json out.json]
  OPENBLAS_CORETYPE=Haswell python benchmarks/bench_fsdp2.py     # NumPy's Haswell kernels
  python benchmarks/bench_fsdp2.py --quick                        # a smoke run
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's minidist, installed or not
sys.path.insert(0, HERE)                   # bench_gpt's torch twin of the GPT

import numpy as np  # noqa: E402

FLAVOURS = ("FSDP2", "FSDP1")
SHAPE = dict(vocab_size=62, block_size=32, n_layer=4, n_head=4, n_embd=64)
PER_RANK = 8
LR = 1e-3


def config(quick: bool):
    from minidist.models.gpt import GPTConfig

    if quick:
        return GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=16)
    return GPTConfig(**SHAPE)


def batches(cfg, rank: int, world: int, count: int = 4):
    """This rank's ``count`` batches of token ids and next tokens."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (count, world * PER_RANK, cfg.block_size + 1))
    mine = tokens[:, rank * PER_RANK:(rank + 1) * PER_RANK]
    return [(np.ascontiguousarray(t[:, :-1]), np.ascontiguousarray(t[:, 1:])) for t in mine]


# ----------------------------------------------------------------- minidist
def build(flavour: str, cfg):
    from minidist import optim
    from minidist.models.gpt import GPT
    from minidist.parallel.data import FullyShardedDataParallel
    from minidist.parallel.placements import fully_shard

    model = GPT(cfg, rng=0)
    if flavour == "FSDP2":
        for block in model.transformer.h:
            fully_shard(block, algorithm="ring")
        wrapped = fully_shard(model, algorithm="ring")
    else:
        wrapped = FullyShardedDataParallel(model, sharding_strategy="FULL_SHARD",
                                           algorithm="ring")
    optimizer = optim.AdamW(wrapped.parameters(), lr=LR, betas=(0.9, 0.99), weight_decay=0.1)
    vocab = cfg.vocab_size
    from minidist.nn import functional as F

    def step(x, y):
        loss = F.cross_entropy(wrapped(x).reshape(-1, vocab), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return float(loss.data)

    shard_bytes = sum(p.data.nbytes for p in wrapped.parameters())
    return step, shard_bytes


def minidist_worker(cfg, steps: int, round_index: int, traced: bool):
    import minidist.distributed as dist
    from minidist import trace
    from minidist.runtime.blas_threads import set_blas_threads

    set_blas_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    data = batches(cfg, rank, world)
    flavours = {name: build(name, cfg) for name in FLAVOURS}
    first = {name: flavours[name][0](*data[0]) for name in FLAVOURS}   # and a warm-up
    if traced:
        regions = {}
        for name in FLAVOURS:
            dist.barrier()
            start = trace.now()
            flavours[name][0](*data[1])
            regions[name] = (start, trace.now())
        return {"regions": regions, "shard_bytes": {n: f[1] for n, f in flavours.items()}}
    order = FLAVOURS[round_index % 2:] + FLAVOURS[:round_index % 2]
    times = {}
    for name in order:
        step = flavours[name][0]
        step(*data[1])
        dist.barrier()
        start = time.perf_counter()
        for index in range(steps):
            step(*data[index % len(data)])
        times[name] = (time.perf_counter() - start) / steps
    return {"times": times, "first": first}


def run_minidist(cfg, steps: int, round_index: int) -> dict:
    import minidist

    per_rank = minidist.launch(minidist_worker, world_size=2, transport="shm",
                               args=(cfg, steps, round_index, False), timeout=600)
    return {"times": {name: max(r["times"][name] for r in per_rank) for name in FLAVOURS},
            "first": per_rank[0]["first"]}


def minidist_bytes(cfg) -> dict:
    """Bytes each rank sent in one step of each flavour (the trace's send events)."""
    import minidist
    from minidist import trace

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.jsonl")
        per_rank = minidist.launch(minidist_worker, world_size=2, transport="shm",
                                   args=(cfg, 1, 0, True), trace=path, timeout=600)
        events = trace.read_jsonl(path).events
    sent = {}
    for name in FLAVOURS:
        for rank, result in enumerate(per_rank):
            lo, hi = result["regions"][name]
            for event in events:
                if (event["rank"] == rank and event["kind"] == "send" and lo <= event["start"] < hi
                        and trace.label_info(event["label"]).get("call") is not None):
                    kind = event["label"].split(" ")[0]
                    key = (name, rank, kind)
                    sent[key] = sent.get(key, 0) + event["bytes"]
    out = {}
    for name in FLAVOURS:
        out[name] = {kind: max(v for (n, r, k), v in sent.items() if n == name and k == kind)
                     for kind in ("all_gather", "reduce_scatter", "all_reduce")
                     if any(n == name and k == kind for (n, r, k) in sent)}
        out[name]["shard_bytes"] = [r["shard_bytes"][name] for r in per_rank]
    return out


def fsdp2_formula(cfg, world: int = 2, itemsize: int = 4) -> dict:
    """FSDP2's bytes per rank and step (ring): each non-root unit gathered twice,
    the root once, every unit reduce_scattered once; S per unit as
    minidist.parallel.placements.fsdp_params pads it."""
    from minidist.models.gpt import GPT

    model = GPT(cfg, rng=0)
    blocks = [sum(-(-p.data.shape[0] // world) * (p.data.size // p.data.shape[0])
                  for p in block.parameters()) for block in model.transformer.h]
    inside = {id(p) for block in model.transformer.h for p in block.parameters()}
    root = sum(-(-p.data.shape[0] // world) * (p.data.size // p.data.shape[0])
               for p in model.parameters() if id(p) not in inside)
    each = (world - 1) * itemsize
    return {"all_gather": each * (2 * sum(blocks) + root),
            "reduce_scatter": each * (sum(blocks) + root)}


# ------------------------------------------------------------------ PyTorch
def torch_worker(rank, world_size, rendezvous, cfg, weights, steps, results):
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"
    import torch
    import torch.distributed as tdist
    from bench_gpt import torch_gpt
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn import functional as F

    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                             world_size=world_size)
    mesh = init_device_mesh("cpu", (world_size,))
    model = torch_gpt(cfg, weights)
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.99), weight_decay=0.1)
    data = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in
            batches(cfg, rank, world_size)]

    def step(x, y):
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    first = step(*data[0])
    step(*data[1])
    tdist.barrier()
    start = time.perf_counter()
    for index in range(steps):
        step(*data[index % len(data)])
    results.put((rank, {"time": (time.perf_counter() - start) / steps, "first": first}))
    tdist.destroy_process_group()


def run_torch(cfg, steps: int) -> dict:
    from minidist.bench.common import spawn_torch_ranks
    from minidist.models.gpt import GPT

    weights = GPT(cfg, rng=0).state_dict()
    per_rank = spawn_torch_ranks(torch_worker, 2, cfg, weights, steps)
    return {"time": max(r["time"] for r in per_rank.values()), "first": per_rank[0]["first"]}


# ------------------------------------------------------------------- driver
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: a tiny GPT, 1 round")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 9; quick 1)")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps per flavour and round (default 10; quick 2)")
    parser.add_argument("--no-torch", action="store_true", help="skip torch's fully_shard")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 9)
    steps = args.steps or (2 if args.quick else 10)
    cfg = config(args.quick)
    have_torch = not args.no_torch and importlib.util.find_spec("torch") is not None

    from minidist.bench.common import machine
    from minidist.runtime.blas_threads import openblas_cores

    times = {name: [] for name in FLAVOURS + (("torch FSDP2",) if have_torch else ())}
    firsts = {}
    for index in range(rounds):
        result = run_minidist(cfg, steps, index)
        for name in FLAVOURS:
            times[name].append(result["times"][name])
        firsts.update(result["first"])
        if have_torch:
            torch_result = run_torch(cfg, steps)
            times["torch FSDP2"].append(torch_result["time"])
            firsts["torch FSDP2"] = torch_result["first"]
        print(f"round {index + 1}/{rounds}: " + ", ".join(
            f"{name} {values[-1] * 1e3:.2f} ms" for name, values in times.items()), flush=True)
    spread = max(firsts.values()) - min(firsts.values())
    if spread > 1e-4:
        raise RuntimeError(f"bench_fsdp2: the first losses disagree: {firsts}")
    sent = minidist_bytes(cfg)
    formula = fsdp2_formula(cfg)
    if {k: sent["FSDP2"].get(k, 0) for k in formula} != formula:
        raise RuntimeError(f"bench_fsdp2: FSDP2's traced bytes {sent['FSDP2']} are not the "
                           f"formula's {formula}")
    sent["torch FSDP2"] = dict(formula, shard_bytes=sent["FSDP2"]["shard_bytes"],
                               formula=True)
    median = {name: statistics.median(values) for name, values in times.items()}
    # Each round's ratio to FSDP2's (the rounds run back to back, so a ratio
    # cancels most of what other work on the machine does to both).
    ratios = {name: [t / f for t, f in zip(values, times["FSDP2"])]
              for name, values in times.items()}
    rows = []
    for name in times:
        moved = sum(v for k, v in sent[name].items() if k in ("all_gather", "reduce_scatter",
                                                            "all_reduce"))
        rows.append({"flavour": name, "step_ms": median[name] * 1e3,
                     "range_ms": [min(times[name]) * 1e3, max(times[name]) * 1e3],
                     "rounds_ms": [t * 1e3 for t in times[name]],
                     "over_fsdp2": statistics.median(ratios[name]),
                     "over_fsdp2_range": [min(ratios[name]), max(ratios[name])],
                     "all_gather_bytes": sent[name].get("all_gather", 0),
                     "reduce_scatter_bytes": sent[name].get("reduce_scatter", 0),
                     "all_reduce_bytes": sent[name].get("all_reduce", 0),
                     "sent_bytes": moved, "sent_over_fsdp2": moved / rows[0]["sent_bytes"]
                     if rows else 1.0,
                     "shard_bytes": sent[name]["shard_bytes"],
                     "bytes_from": "formula" if sent[name].get("formula") else "trace"})
    blas = ", ".join(openblas_cores()) or "not OpenBLAS"
    print(f"\nGPT {cfg}, 2 ranks, {PER_RANK} sequences each, median of {rounds} rounds of "
          f"{steps} steps; NumPy's BLAS: {blas}")
    print("| flavour | step ms [range] | / FSDP2 [range] | all_gather B | reduce_scatter B | all_reduce B "
          "| sent B / FSDP2 | shard bytes rank 0, 1 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        source = " (formula)" if row["bytes_from"] == "formula" else ""
        low, high = row["range_ms"]
        r_low, r_high = row["over_fsdp2_range"]
        print(f"| {row['flavour']} | {row['step_ms']:.1f} [{low:.1f}-{high:.1f}] | "
              f"{row['over_fsdp2']:.2f} [{r_low:.2f}-{r_high:.2f}] | "
              f"{row['all_gather_bytes']:,}{source} | {row['reduce_scatter_bytes']:,}{source} | "
              f"{row['all_reduce_bytes']:,} | {row['sent_over_fsdp2']:.3f} | "
              f"{row['shard_bytes'][0]:,}, {row['shard_bytes'][1]:,} |")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump({"benchmark": "fsdp2", "machine": machine(), "blas": blas,
                       "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
                       "config": {k: getattr(cfg, k) for k in SHAPE}, "per_rank": PER_RANK,
                       "rounds": rounds, "steps": steps, "first_losses": firsts,
                       "results": rows}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
