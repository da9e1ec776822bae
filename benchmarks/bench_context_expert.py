"""Bytes and time of context parallelism (ring attention, Ulysses) and expert
parallelism (the mixture of experts' all_to_all dispatch) against their
formulas: measured at 2 ranks (and 4 with ``--full``), simulated beyond.

**Measured** (one launch per world size, ``--transport``, float32, one BLAS
thread a rank). The cases:

  ring      ring_attention on (B, H, T/n, D) zig-zag pieces, causal
  ulysses   ulysses_attention on the same pieces, causal
  moe k=1   ExpertParallelMoE (E experts, top-1, no capacity bound) on N tokens a rank
  moe k=2   the same, top-2

First one traced call of each, forward and backward in their own trace
regions: each rank's sends inside the region (the region's own rank, its
clock) against :mod:`minidist.parallel.context.costs` and
:func:`~minidist.parallel.expert.costs.dispatch_bytes` of the
dispatch matrix the routings gave. Then ``--rounds`` rounds; in each,
every case runs ``--reps`` forwards and backwards after a barrier, the
order rotating from round to round, and the communication of each case
runs alone (``comm``: the same messages without the arithmetic: the ring's
n - 1 K, V steps as a ring all_gather of the blocks, Ulysses' four
all_to_alls, the MoE's counts, dispatch and combine all_to_alls with the
routing's split sizes). The table gives the median over rounds of the
slowest rank's time (``time.perf_counter``), next to the cost model's time
for those messages (:data:`minidist.alpha_beta.PARAMS` of the transport,
through :func:`minidist.distributed.simulator.simulate`). The script exits
with an error when a rank's bytes differ from the formula's.

**Simulated** (this process, no ranks): for n from 8 to 256, the formulas'
bytes per rank and the simulator's time for the messages: ring attention's
K, V pass (n - 1 steps of one block: a ring all_gather; backward adds the
n hops of dK, dV), Ulysses' all_to_alls (pairwise; only while n divides
the heads), and the MoE's dispatch and combine with one expert a rank and
the routing even (:func:`balanced_dispatch_bytes`), next to the dense MLP's
tensor-parallel all_reduce of the same tokens.

More ranks than cores (``--full`` on 2 cores) runs correctly, but the
times then include the scheduler's turns.

Usage:  python benchmarks/bench_context_expert.py [--full] [--rounds 5 --reps 2]
                                                  [--transport shm] [--json out.json]
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
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's minidist, installed or not

import numpy as np  # noqa: E402

CP_CASES = ("ring", "ulysses")
MOE_CASES = {"moe k=1": 1, "moe k=2": 2}
ITEMSIZE = 4   # float32
SIMULATED_WORLDS = (8, 16, 32, 64, 128, 256)


# --------------------------------------------------------------------------- the workers


def _cp_inputs(shape, world, rank):
    from minidist.parallel.context.split import shard_sequence
    from minidist.tensor import Tensor

    batch, heads, seq_len, width = shape
    rng = np.random.default_rng(0)
    whole = [rng.standard_normal((batch, heads, seq_len, width)).astype(np.float32)
             for _ in range(4)]
    q, k, v, grad = (shard_sequence(x, seq_len, world, rank, axis=2) for x in whole)
    return [Tensor(x, requires_grad=True) for x in (q, k, v)], Tensor(grad)


def _cp_pass(scheme, shape, world, rank):
    """(forward, backward) closures of one attention call on this rank's pieces."""
    from minidist.parallel.context.ring_attention import ring_attention
    from minidist.parallel.context.ulysses import ulysses_attention

    attend = ring_attention if scheme == "ring" else ulysses_attention
    (q, k, v), grad = _cp_inputs(shape, world, rank)
    held = {}

    def forward():
        for x in (q, k, v):
            x.grad = None
        held["out"] = attend(q, k, v, shape[2], is_causal=True)

    def backward():
        (held.pop("out") * grad).sum().backward()

    return forward, backward


def _moe_pass(config, top_k, tokens, rank):
    from minidist.models.moe import MoE
    from minidist.parallel.expert.dispatch import ExpertParallelMoE
    from minidist.tensor import Tensor

    moe = MoE(config, config.n_expert, top_k, capacity_factor=None, rng=3)
    shard = ExpertParallelMoE(moe)
    rng = np.random.default_rng(100 + rank)
    x = Tensor(rng.standard_normal((1, tokens, config.n_embd)).astype(np.float32),
               requires_grad=True)
    weights = Tensor(rng.standard_normal((1, tokens, config.n_embd)).astype(np.float32))
    held = {}

    def forward():
        x.grad = None
        held["y"] = shard(x)

    def backward():
        (held.pop("y") * weights).sum().backward()

    return forward, backward, shard


def _comm_only(name, shape, width, shard, world):
    """A closure that sends the case's messages and does nothing else."""
    import minidist.distributed as dist
    from minidist.parallel.context.split import rank_positions

    rank = dist.get_rank()
    batch, heads, seq_len, width = shape
    if name == "ring":
        # K and V of one rank's block, as one message a step to the right.
        block = np.zeros(batch * heads * len(rank_positions(seq_len, world, rank)) * 2 * width,
                         np.float32)
        out = np.empty(block.size * world, np.float32)
        return lambda: dist.all_gather_into_tensor(out, block, algorithm="ring")
    if name == "ulysses":
        from minidist.parallel.context.ulysses import ALGORITHM
        local = batch * heads * (seq_len // world) * width
        source, out = np.zeros(local, np.float32), np.empty(local, np.float32)

        def four():   # q, k, v to heads, O back
            for _ in range(4):
                dist.all_to_all_single(out, source, algorithm=ALGORITHM)
        return four
    from minidist.parallel.expert.dispatch import ALL_TO_ALL
    sent, received = shard.dispatch.sent, shard.dispatch.received
    counts = np.zeros(shard.n_expert, np.int64)
    counts_out = np.empty_like(counts)
    rows = np.zeros((int(sent.sum()), width), np.float32)
    arrived = np.empty((int(received.sum()), width), np.float32)

    def exchange():   # counts, dispatch, combine
        dist.all_to_all_single(counts_out, counts, algorithm=ALL_TO_ALL)
        dist.all_to_all_single(arrived, rows, output_split_sizes=received.tolist(),
                               input_split_sizes=sent.tolist(), algorithm=ALL_TO_ALL)
        dist.all_to_all_single(rows, arrived, output_split_sizes=sent.tolist(),
                               input_split_sizes=received.tolist(), algorithm=ALL_TO_ALL)
    return exchange


def worker(cp_shape, moe_config, tokens, rounds, reps):
    import minidist.distributed as dist
    from minidist import trace
    from minidist.runtime.blas_threads import set_blas_threads

    set_blas_threads(1)
    world, rank = dist.get_world_size(), dist.get_rank()
    cases, routings = {}, {}
    for scheme in CP_CASES:
        cases[scheme] = _cp_pass(scheme, cp_shape, world, rank) + (None,)
    for name, top_k in MOE_CASES.items():
        cases[name] = _moe_pass(moe_config, top_k, tokens, rank)
    for name, (forward, backward, _) in cases.items():
        dist.barrier()
        with trace.region(f"{name} forward"):
            forward()
        with trace.region(f"{name} backward"):
            backward()
        if cases[name][2] is not None:
            routings[name] = cases[name][2].routing.load
    comms = {name: _comm_only(name, cp_shape, moe_config.n_embd, shard, world)
             for name, (_, _, shard) in cases.items()}
    times = {(name, part): [] for name in cases for part in ("forward", "backward", "comm")}
    names = list(cases)
    for round_ in range(rounds):
        order = names[round_ % len(names):] + names[:round_ % len(names)]
        for name in order:
            forward, backward, _ = cases[name]
            spent = dict.fromkeys(("forward", "backward", "comm"), 0.0)
            for _ in range(reps):
                dist.barrier()
                start = time.perf_counter()
                forward()
                middle = time.perf_counter()
                backward()
                spent["forward"] += middle - start
                spent["backward"] += time.perf_counter() - middle
            for _ in range(reps):
                dist.barrier()
                start = time.perf_counter()
                comms[name]()
                spent["comm"] += time.perf_counter() - start
            for part, seconds in spent.items():
                times[name, part].append(seconds / reps)
    return {"times": times, "load": routings}


# --------------------------------------------------------------------------- bytes


def sent_in_regions(events, world):
    """{(region label, rank): bytes that rank sent inside its own region}."""
    from minidist import trace

    regions = {(trace.label_text(e["label"]), e["rank"]): (e["start"], e["end"])
               for e in events if e["kind"] == "compute"}
    sent = {}
    for event in events:
        if event["kind"] != "send":
            continue
        for (label, rank), (start, end) in regions.items():
            if rank == event["rank"] and start <= event["start"] <= end and " " in label \
                    and label.split(" ")[-1] in ("forward", "backward") \
                    and label.rsplit(" ", 1)[0] in set(CP_CASES) | set(MOE_CASES):
                sent[label, rank] = sent.get((label, rank), 0) + event["bytes"]
    return sent


def formulas(world, cp_shape, moe_config, loads):
    """{(case, pass): bytes per rank by formula}; ``loads[case][rank]``: that
    rank's routing's load per expert."""
    from minidist.parallel.context.costs import ring_attention_bytes, ulysses_bytes
    from minidist.parallel.expert.costs import dispatch_bytes

    batch, heads, seq_len, width = cp_shape
    found = {}
    for scheme, formula in (("ring", ring_attention_bytes), ("ulysses", ulysses_bytes)):
        cost = formula(batch, heads, seq_len, width, world, ITEMSIZE)
        found[scheme, "forward"], found[scheme, "backward"] = cost.forward, cost.backward
    for name in MOE_CASES:
        matrix = np.stack([np.asarray(load).reshape(world, -1).sum(axis=1)
                           for load in loads[name]])
        cost = dispatch_bytes(matrix, moe_config.n_expert, moe_config.n_embd, ITEMSIZE)
        found[name, "forward"], found[name, "backward"] = cost.forward, cost.backward
    return found


# --------------------------------------------------------------------------- the model's times


def ring_seconds(block_bytes, world, params):
    """(forward, backward) seconds of ring attention's messages, simulated:
    n - 1 steps of one K, V block (a ring all_gather of the n blocks);
    backward the same plus n hops of a dK, dV block."""
    from minidist.distributed.simulator import simulate

    forward = simulate("all_gather", "ring", world, world * block_bytes, alpha=params.alpha,
                       beta=params.xbeta, gamma=params.gamma).time
    return forward, forward + world * params.message(block_bytes)


def all_to_all_seconds(nbytes, world, params):
    """One pairwise all_to_all of ``nbytes`` a rank (its whole array), simulated."""
    from minidist.distributed.simulator import simulate

    return simulate("all_to_all", "pairwise", world, int(nbytes), alpha=params.alpha,
                    beta=params.xbeta, gamma=params.gamma).time


def model_comm_seconds(name, world, cp_shape, moe_config, tokens, top_k, params):
    """The cost model's time of the messages ``_comm_only`` sends (even pieces)."""
    batch, heads, seq_len, width = cp_shape
    local = batch * heads * (seq_len // world) * width * ITEMSIZE
    if name == "ring":
        return ring_seconds(2 * local, world, params)[0]
    if name == "ulysses":
        return 4 * all_to_all_seconds(local, world, params)
    rows = top_k * tokens * moe_config.n_embd * ITEMSIZE
    return (all_to_all_seconds(moe_config.n_expert * 8, world, params)
            + 2 * all_to_all_seconds(rows, world, params))


def simulated_rows(sim_shape, width_moe, tokens, params):
    """The beyond-the-machine table: one row per world size."""
    from minidist.distributed.simulator import simulate
    from minidist.parallel.context.costs import ring_attention_bytes, ulysses_bytes
    from minidist.parallel.expert.costs import balanced_dispatch_bytes, dense_mlp_all_reduce_bytes

    batch, heads, seq_len, width = sim_shape
    rows = []
    for world in SIMULATED_WORLDS:
        local = batch * heads * (seq_len // world) * width * ITEMSIZE
        ring = ring_attention_bytes(batch, heads, seq_len, width, world, ITEMSIZE)
        ring_time = ring_seconds(2 * local, world, params)
        row = {"world": world,
               "ring_bytes": [max(ring.forward), max(ring.backward)],
               "ring_s": list(ring_time)}
        if heads % world == 0:
            ulysses = ulysses_bytes(batch, heads, seq_len, width, world, ITEMSIZE)
            each = 4 * all_to_all_seconds(local, world, params)
            row.update(ulysses_bytes=[max(ulysses.forward), max(ulysses.backward)],
                       ulysses_s=[each, each])
        for top_k in (1, 2):
            rows_bytes = top_k * tokens * width_moe * ITEMSIZE
            row[f"moe{top_k}_bytes"] = balanced_dispatch_bytes(tokens, top_k, width_moe, world,
                                                               ITEMSIZE)
            row[f"moe{top_k}_s"] = (all_to_all_seconds(world * 8, world, params)
                                    + 2 * all_to_all_seconds(rows_bytes, world, params))
        dense = dense_mlp_all_reduce_bytes(tokens, width_moe, world, ITEMSIZE)
        row["dense_bytes"] = max(dense)
        row["dense_s"] = simulate("all_reduce", "ring", world, tokens * width_moe * ITEMSIZE,
                                  alpha=params.alpha, beta=params.xbeta,
                                  gamma=params.gamma).time
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- main


def _ms(seconds):
    return f"{seconds * 1e3:8.2f} ms"


def _mb(nbytes):
    return f"{nbytes / 1e6:9.3f} MB"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="also measure at 4 ranks")
    parser.add_argument("--transport", default="shm", choices=("shm", "pipe"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--width", type=int, default=64, help="the MoE's n_embd")
    parser.add_argument("--tokens", type=int, default=512, help="MoE tokens per rank")
    parser.add_argument("--sim-heads", type=int, default=64)
    parser.add_argument("--sim-seq-len", type=int, default=16384)
    parser.add_argument("--sim-width", type=int, default=1024, help="simulated MoE's n_embd")
    parser.add_argument("--sim-tokens", type=int, default=4096,
                        help="simulated MoE tokens per rank")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import minidist
    from minidist import alpha_beta, trace
    from minidist.models.moe import MoEGPTConfig

    params = alpha_beta.PARAMS[args.transport]
    cp_shape = (args.batch, args.heads, args.seq_len, args.head_dim)
    moe_config = MoEGPTConfig(vocab_size=16, block_size=args.tokens, n_layer=1, n_head=1,
                              n_embd=args.width, n_expert=args.experts, top_k=1)
    load_before = os.getloadavg()
    print(f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}; load average "
          f"{load_before[0]:.1f}; clock time.perf_counter; transport {args.transport} "
          f"(model: alpha {params.alpha * 1e6:.1f} us, beta {params.beta * 1e9:.3f} ns/B)")
    print(f"attention: B={args.batch}, H={args.heads}, T={args.seq_len}, D={args.head_dim}, "
          f"causal, zig-zag, float32; MoE: {args.experts} experts, width {args.width}, "
          f"{args.tokens} tokens a rank, no capacity bound")
    print(f"\n{'case':<9} {'n':>2} {'pass':<8} {'bytes/rank (trace)':>20} "
          f"{'formula':>12} {'layer time':>11} {'comm alone':>11} {'model':>11}")
    measured, wrong = [], []
    worlds = (2, 4) if args.full else (2,)
    for world in worlds:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, f"cp_ep_{world}.jsonl")
            per_rank = minidist.launch(worker, world_size=world, transport=args.transport,
                                       trace=path, timeout=1200,
                                       args=(cp_shape, moe_config, args.tokens, args.rounds,
                                             args.reps))
            sent = sent_in_regions(trace.read_jsonl(path).events, world)
        loads = {name: [result["load"][name] for result in per_rank] for name in MOE_CASES}
        expected = formulas(world, cp_shape, moe_config, loads)
        for name in (*CP_CASES, *MOE_CASES):
            top_k = MOE_CASES.get(name, 0)
            model = model_comm_seconds(name, world, cp_shape, moe_config, args.tokens, top_k,
                                       params)
            comm = statistics.median(max(r["times"][name, "comm"][i] for r in per_rank)
                                     for i in range(args.rounds))
            for part in ("forward", "backward"):
                trace_bytes = tuple(sent.get((f"{name} {part}", rank), 0) for rank in range(world))
                formula = tuple(expected[name, part])
                layer = statistics.median(max(r["times"][name, part][i] for r in per_rank)
                                          for i in range(args.rounds))
                measured.append({"case": name, "world": world, "pass": part,
                                 "trace_bytes": list(trace_bytes), "formula_bytes": list(formula),
                                 "layer_s": layer, "comm_s": comm if part == "forward" else None,
                                 "model_comm_s": model if part == "forward" else None})
                mark = "=" if trace_bytes == formula else "!="
                if trace_bytes != formula:
                    wrong.append(f"{name}, {world} ranks, {part}: trace {list(trace_bytes)}, "
                                 f"formula {list(formula)}")
                print(f"{name:<9} {world:>2} {part:<8} {max(trace_bytes):>20,} "
                      f"{mark} {max(formula):>10,} {_ms(layer)} "
                      + (f"{_ms(comm)} {_ms(model)}" if part == "forward" else ""))
    load_after = os.getloadavg()
    print(f"(bytes: the largest rank's; comm alone and model: the forward's messages, once; "
          f"load average after {load_after[0]:.1f})")

    sim_shape = (args.batch, args.sim_heads, args.sim_seq_len, args.head_dim)
    rows = simulated_rows(sim_shape, args.sim_width, args.sim_tokens, params)
    print(f"\nsimulated ({args.transport}'s alpha and beta), attention B={args.batch}, "
          f"H={args.sim_heads}, T={args.sim_seq_len}, D={args.head_dim}; MoE width "
          f"{args.sim_width}, one expert a rank, {args.sim_tokens} tokens a rank, routing even, "
          f"counts left out; per rank, forward:")
    print(f"{'n':>4} {'ring bytes':>12} {'ring time':>11} {'ulysses bytes':>14} "
          f"{'ulysses time':>12} {'moe k=1':>12} {'time':>11} {'moe k=2':>12} {'time':>11} "
          f"{'dense AR':>12} {'time':>11}")
    for row in rows:
        ulysses = (f"{_mb(row['ulysses_bytes'][0]):>14} {_ms(row['ulysses_s'][0]):>12}"
                   if "ulysses_bytes" in row else f"{'-':>14} {'-':>12}")
        print(f"{row['world']:>4} {_mb(row['ring_bytes'][0])} {_ms(row['ring_s'][0])} "
              f"{ulysses} {_mb(row['moe1_bytes'])} {_ms(row['moe1_s'])} "
              f"{_mb(row['moe2_bytes'])} {_ms(row['moe2_s'])} {_mb(row['dense_bytes'])} "
              f"{_ms(row['dense_s'])}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"config": vars(args), "cores": os.cpu_count(),
                       "load_average": [load_before[0], load_after[0]],
                       "clock": "time.perf_counter", "measured": measured, "simulated": rows},
                      handle, indent=1)
    if wrong:
        raise SystemExit("bytes in the trace differ from the formula:\n" + "\n".join(wrong))


if __name__ == "__main__":
    main()
