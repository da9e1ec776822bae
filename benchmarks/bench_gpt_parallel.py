"""Bytes and time per training step of the GPT under DP, TP, SP, PP and their
products, at 2 and 4 processes.

Every configuration is a :class:`~minidist.parallel.mesh.gpt_3d.GPT3D` on a
``(pp, dp, tp)`` device mesh, so the strategies differ only in the mesh's
shape (and sequence parallelism, and the pipeline's schedule):

  2 ranks   DP 2, TP 2, TP+SP 2, PP 2 (1F1B), PP 2 (interleaved 1F1B, 2 chunks)
  4 ranks   DP 4, TP 4, PP 4, DP2xTP2, TP2xPP2, DP2xPP2, (and --with-8: DP2xTP2xPP2)

The model: the GPT of ``minidist train --model gpt`` narrowed (``--n-layer 4
--n-head 4 --n-embd 64 --block-size 32``, the 62 characters of the bundled
Shakespeare), global batch ``--batch 8`` cut into 2 micro-batches for the
pipelines, AdamW, float32, one BLAS thread per rank.

One traced launch per world size. In it each configuration first runs one
step inside a trace region (its bytes: every send of every rank inside that
region, attributed to the mesh dimension its two ranks differ in,
``viz.timeline.message_dimension``; the construction's broadcast over dp
comes before it and is not counted); then ``--windows`` rounds, in each of
which every configuration runs ``--steps`` steps after a barrier (the
configurations take turns, the order rotating from round to round). The
table gives the median over rounds of the slowest rank's time per step.

Next to the trace's bytes, :func:`formula_bytes` (``gpt_step_bytes`` for tp
and sp, the dp all_reduce's traffic, the pipeline's activations and the tied
embedding's sum for pp); the script exits with an error if any differ.
Next to the time, ``plan_3d.predict_step`` on a model of this machine
(:func:`local_machine`). Then ``predict_step`` on ``plan_inputs.CLUSTER`` for
meshes of 1,024 ranks (:data:`LARGE_PLANS`: DP, TP, TP + SP, PP and their
products, 8 x 8 x 16 among them) of a 32-layer, width-4096 GPT.

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
MICROBATCHES = 2
ITEMSIZE = 4   # float32


def worker(world, config, batches, steps, windows, lr):
    import minidist.distributed as dist
    from minidist import optim, trace
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.models.gpt import GPT
    from minidist.parallel.mesh.gpt_3d import GPT3D
    from minidist.runtime.blas_threads import set_blas_threads

    set_blas_threads(1)
    runs = {}
    for name, (shape, schedule, virtual, sp) in CONFIGS[world].items():
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=DIMS)
        gpt = GPT3D(GPT(config, rng=0), mesh, schedule, microbatches=MICROBATCHES,
                    virtual_stages=virtual, sequence_parallel=sp)
        runs[name] = (gpt, optim.AdamW(gpt.parameters(), lr=lr))
    # What the formulas need of each rank: its parameters (the dp all_reduce's
    # values) and its copy of the tied embedding (the embedding group's).
    held = {name: (sum(p.data.size for p in gpt.parameters()),
                   gpt.tied_parameter().data.size if gpt.embedding_group is not None else 0)
            for name, (gpt, _) in runs.items()}
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
    return {"times": times, "held": held}


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


def _rank(mesh_shape, p, d, t):
    """The global rank at mesh coordinates (p, d, t): row-major, tp fastest."""
    _, dp, tp = mesh_shape
    return (p * dp + d) * tp + t


def _all_reduce_bytes(count, ranks, transport):
    """Bytes all ``ranks`` send in one all_reduce of ``count`` float32 values
    with the algorithm "auto" picks for them (the traffic the code sends)."""
    from minidist import costmodel
    from minidist.distributed.collectives import ALGORITHMS

    if ranks == 1:
        return 0
    name = costmodel.best("all_reduce", ranks, count * ITEMSIZE, transport=transport,
                          candidates=tuple(ALGORITHMS["all_reduce"]))
    return costmodel.TRAFFIC["all_reduce"][name](ranks, count, ITEMSIZE)[1]


def formula_bytes(world, name, config, batch, held, transport):
    """{dim: bytes all ranks send in one step}, by formula (no trace):

    * tp: :func:`~minidist.parallel.tensor.costs.gpt_step_bytes` of
      one micro-batch (b = B / (dp m) sequences) per micro-batch and replica,
      the sequence-parallel gradient sum once a step;
    * dp: one all_reduce of each rank's P_r gradients and its example count
      on its dp group (the Pipeline's), the algorithm "auto" picks;
    * pp: one (b, T, C) activation forward and its gradient back per
      micro-batch and stage boundary, for every tp rank (T / tp with sequence
      parallelism) and replica, plus the tied ``wte`` / ``lm_head`` gradient's
      all_reduce between the first and last stage (the embedding group).

    ``held[rank]``: (parameters, tied weight's values) of that rank."""
    from minidist.parallel.tensor.costs import gpt_step_bytes

    shape, _, virtual, sp = CONFIGS[world][name]
    pp, dp, tp = shape
    if batch % (dp * MICROBATCHES):
        raise ValueError(f"the formulas take even micro-batches: batch {batch} over {dp} "
                         f"replicas x {MICROBATCHES} micro-batches")
    b, steps, width = batch // (dp * MICROBATCHES), config.block_size, config.n_embd
    sent = dict.fromkeys(DIMS, 0)
    if tp > 1:
        one = gpt_step_bytes(config, b, steps, tp, sp, ITEMSIZE)
        once = "sequence-parallel gradients"
        per_microbatch = sum(count * sum(values) for _, what, count, values in one.lines
                             if once not in what)
        per_step = sum(count * sum(values) for _, what, count, values in one.lines
                       if once in what)
        sent["tp"] = dp * (MICROBATCHES * per_microbatch + per_step) * ITEMSIZE
    if dp > 1:
        sent["dp"] = sum(_all_reduce_bytes(held[_rank(shape, p, 0, t)][0] + 1, dp, transport)
                         for p in range(pp) for t in range(tp))
    if pp > 1:
        activation = b * steps * width * ITEMSIZE // (tp if sp else 1)
        sent["pp"] = 2 * MICROBATCHES * (pp * virtual - 1) * activation * tp * dp
        sent["pp"] += sum(_all_reduce_bytes(held[_rank(shape, 0, d, t)][1], 2, transport)
                          for d in range(dp) for t in range(tp))
    return sent


def local_machine(config, batch, transport):
    """plan_inputs.Machine for this computer: one rank's FLOP/s on the model's
    MLP product of one micro-batch, (b T, C) @ (C, 4C) in float32 on one BLAS
    thread (the product that dominates a block), the transport's alpha and
    beta for every link."""
    import numpy as np

    from minidist.alpha_beta import PARAMS
    from minidist.parallel.mesh.plan_inputs import Machine
    from minidist.runtime.blas_threads import set_blas_threads

    set_blas_threads(1)
    rows, width = batch // MICROBATCHES * config.block_size, config.n_embd
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, width)).astype(np.float32)
    w = rng.standard_normal((width, 4 * width)).astype(np.float32)
    times = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(50):
            x @ w
        times.append((time.perf_counter() - start) / 50)
    flops = 2 * rows * width * 4 * width / statistics.median(times)
    return Machine(flops=flops, intra=PARAMS[transport], inter=PARAMS[transport],
                   node_size=8)


def predicted_step(world, name, config, batch, machine):
    """plan_3d.predict_step of one measured configuration on ``machine``;
    None where the plan's model cannot take it (its stages must hold equal
    numbers of blocks, GPT3D's need not)."""
    from minidist.parallel.mesh.plan_3d import predict_step
    from minidist.parallel.mesh.plan_inputs import GPTShape, Plan, why_not

    (pp, dp, tp), schedule, virtual, sp = CONFIGS[world][name]
    shape = GPTShape.from_config(config, batch, micro_batch=batch // (dp * MICROBATCHES))
    plan = Plan(dp=dp, tp=tp, pp=pp, schedule=schedule, virtual_stages=virtual,
                sequence_parallel=sp)
    if why_not(shape, plan) is not None:
        return None
    return predict_step(shape, plan, machine, itemsize=ITEMSIZE)


#: The large mesh: the 32-layer, width-4096 GPT of plan_3d's docstring, 1,024
#: sequences of 4,096 tokens a step, on plan_inputs.CLUSTER, meshes of 1,024 ranks.
LARGE = dict(n_layer=32, n_embd=4096, n_head=32, vocab_size=50304, seq_len=4096,
             global_batch=1024, micro_batch=1)
#: name -> (dp, tp, pp, schedule, virtual_stages, sequence_parallel)
LARGE_PLANS = {"DP 1024": (1024, 1, 1, "1f1b", 1, False),
               "TP 8 x DP 128": (128, 8, 1, "1f1b", 1, False),
               "TP 8 + SP x DP 128": (128, 8, 1, "1f1b", 1, True),
               "PP 16 x DP 64": (64, 1, 16, "1f1b", 1, False),
               "DP 8 x TP 8 x PP 16": (8, 8, 16, "1f1b", 1, False),
               "DP 8 x TP 8+SP x PP 16": (8, 8, 16, "1f1b", 1, True),
               "same, interleaved (2)": (8, 8, 16, "interleaved_1f1b", 2, True)}


def large_mesh_rows():
    """{name: plan_3d.predict_step} for :data:`LARGE_PLANS` on plan_inputs.CLUSTER."""
    from minidist.parallel.mesh.plan_3d import predict_step
    from minidist.parallel.mesh.plan_inputs import CLUSTER, GPTShape, Plan

    model = GPTShape(**LARGE)
    return {name: predict_step(model, Plan(dp=dp, tp=tp, pp=pp, schedule=schedule,
                                           virtual_stages=virtual, sequence_parallel=sp),
                               CLUSTER)
            for name, (dp, tp, pp, schedule, virtual, sp) in LARGE_PLANS.items()}


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
    transport = "shm"
    load_before = os.getloadavg()[0]
    print(f"GPT {config.n_layer} layers x width {config.n_embd}, {config.n_head} heads, context "
          f"{config.block_size}, vocabulary {config.vocab_size}, batch {args.batch} "
          f"({MICROBATCHES} micro-batches); {os.cpu_count()} cores, "
          f"{platform.processor() or platform.machine()}, load average {load_before:.1f}; "
          f"clock time.perf_counter; transport {transport}")
    print(f"{'configuration':<18} {'step time':>10} {'predicted':>10}   "
          + "   ".join(f"{d + ' bytes: trace = formula':>28}" for d in DIMS)
          + "   (bytes: all ranks, one step)")
    results, wrong = {}, []
    for world in (int(w) for w in args.worlds.split(",")):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, f"gpt_parallel_{world}.jsonl")
            per_rank = minidist.launch(worker, world_size=world, transport=transport,
                                       trace=path, timeout=1200,
                                       args=(world, config, batches, args.steps,
                                             args.windows, 3e-3))
            sent = bytes_by_dimension(trace.read_jsonl(path).events, world)
        machine = local_machine(config, args.batch, transport)
        for name in CONFIGS[world]:
            slowest = [max(rank["times"][name][w] for rank in per_rank)
                       for w in range(args.windows)]
            median = statistics.median(slowest)
            held = [rank["held"][name] for rank in per_rank]
            formula = formula_bytes(world, name, config, args.batch, held, transport)
            step = predicted_step(world, name, config, args.batch, machine)
            predicted = None if step is None else step.total
            if any(sent[name].get(d, 0) != formula[d] for d in DIMS) or sent[name].get("other"):
                wrong.append(f"{name}: trace {sent[name]}, formula {formula}")
            results[name] = {"world": world, "step_s": median, "predicted_s": predicted,
                             "bytes": sent[name], "formula_bytes": formula}
            guess = "-" if predicted is None else f"{predicted * 1e3:.1f} ms"
            print(f"{name:<18} {median * 1e3:>7.1f} ms {guess:>10}   "
                  + "   ".join(f"{sent[name][d]:>13,} {'=' if sent[name][d] == formula[d] else '!='}"
                             f" {formula[d]:>12,}" for d in DIMS))
    load_after = os.getloadavg()[0]
    print(f"(predicted: plan_3d.predict_step on this machine's model: {machine.flops / 1e9:.2f} "
          f"GFLOP/s a rank from one MLP product, the {transport} transport's alpha and beta; "
          f"load average after {load_after:.1f})")

    large = large_mesh_rows()
    print(f"\npredicted at large meshes (plan_3d.predict_step on plan_inputs.CLUSTER): GPT "
          f"{LARGE['n_layer']} layers x width {LARGE['n_embd']}, {LARGE['n_head']} heads, "
          f"vocabulary {LARGE['vocab_size']}, {LARGE['global_batch']} sequences of "
          f"{LARGE['seq_len']} tokens, micro-batch {LARGE['micro_batch']}, bf16")
    print(f"{'plan':<24} {'ranks':>6} {'step':>10} {'compute':>10} {'tp comm':>10} "
          f"{'pp bubble':>10} {'dp comm':>10} {'memory/rank':>12}")
    for name, step in large.items():
        print(f"{name:<24} {step.plan.ranks:>6} "
              + " ".join(f"{value * 1e3:>7.0f} ms" for value in
                         (step.total, step.compute, step.tp_comm, step.pp_bubble, step.dp_comm))
              + f" {step.memory_total / 1e9:>9.1f} GB")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"config": vars(args), "cores": os.cpu_count(), "transport": transport,
                       "load_average": [load_before, load_after], "clock": "time.perf_counter",
                       "local_flops": machine.flops, "results": results,
                       "large_meshes": {name: {"ranks": step.plan.ranks, "step_s": step.total,
                                               "compute_s": step.compute,
                                               "tp_comm_s": step.tp_comm,
                                               "pp_bubble_s": step.pp_bubble,
                                               "dp_comm_s": step.dp_comm,
                                               "memory_bytes": step.memory_total}
                                        for name, step in large.items()}},
                      handle, indent=1)
    if wrong:
        raise SystemExit("bytes in the trace differ from the formula:\n" + "\n".join(wrong))


if __name__ == "__main__":
    main()
