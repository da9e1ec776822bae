"""Gradient compression (DDP communication hooks) on 2 processes: step time, bytes, overlap, slow link.

Models, 2 ranks, SGD lr 0.01 momentum 0.9, ring all-reduce (``algorithm="ring"``),
one BLAS thread per process:

  mlp      ``minidist.train.build_model("mlp")``: 64-128-10 (9,610 parameters),
           the bundled 8x8 digits, 32 examples per rank
  cnn      ``build_model("cnn")``: two convolutions, 38,282 parameters, digits,
           32 examples per rank
  mlp1000  an MLP 1000-500-10 (505,510 parameters, 2 MB of float32 gradient:
           the dense layer of Dettmers' "Model Parallelism in Deep Learning"),
           random normal data, 64 examples per rank (128 global)

MEASURED (two launches of 2 worker processes on shm):

1. A short traced launch: for every model and every configuration of
   ``minidist.experiments.compression.COMPRESSORS`` (none, fp16, bf16, int8,
   sign, threshold, top-k 1%, random-k 1%, PowerSGD r2), two warm-up steps then
   ``TRACED_STEPS`` steps inside a trace region: the bytes rank 0 sends per
   step (``bytes_per_step``) next to ``formula_bytes``, and the messages it
   sends per step.
2. An untraced launch (tracing switches off the shared-slot fast paths and
   costs a little per message): per model, all of these, interleaved in
   ``--windows`` rounds (the order rotating from round to round), each round
   ``--steps`` steps after a barrier; the figure is the median over rounds of
   the slowest rank's time per step:
   * ``local``: the step without DDP (forward, backward, SGD; no communication);
   * each compressor as a hook of ``DistributedDataParallel`` (one 25 MB bucket,
     overlap on), and its ratio to "none";
   * overlap on/off: "none", "top-k 1%" and "PowerSGD r2" with
     ``bucket_mb=0.01`` (several buckets), ``overlap=True`` and ``False``;
   * the peer, in the same processes and the same rounds: PyTorch DDP on gloo
     (``torch.set_num_threads(1)``, rendezvous through a file) with no hook,
     ``default_hooks.fp16_compress_hook`` and ``powerSGD_hook`` (rank 2,
     ``start_powerSGD_iter=2``), same shapes and data; ratio minidist / torch.
     Skipped with a note when torch is not installed (not a dependency).

MODELLED (the slow link; nothing is sent at that bandwidth): a link of
bandwidth B (bit/s) and latency alpha (``--alpha-us``, default 50 us), full
duplex, no overlap of communication with computation (minidist has none: see
``minidist/parallel/data/ddp.py``):

    t_c(B) = local_c + M_c alpha + 8 S_c / B
    local_c = (measured shm step of c) - M_c alpha_shm - S_c beta_shm

S_c and M_c are the bytes and messages per step of rank 0 from the trace,
alpha_shm and beta_shm ``minidist.alpha_beta.PARAMS["shm"]``: local_c is the
measured step with the shm wire time taken out, i.e. the computation plus
the compressor's codec and the collectives' software cost, all measured.
``local_c - local_none`` is the codec overhead. The crossover of c is the B
at which t_c(B) = t_none(B): c wins below it (or "always"/"never").

Usage:  python benchmarks/bench_compression.py [--quick] [--models mlp,cnn,mlp1000]
        [--steps 20 --windows 9] [--no-torch] [--alpha-us 50] [--json PATH]
Writes benchmarks/results/compression.json unless --json says otherwise.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's minidist, installed or not

import numpy as np  # noqa: E402

MODELS = ("mlp", "cnn", "mlp1000")
PER_RANK_BATCH = {"mlp": 32, "cnn": 32, "mlp1000": 64}
NAMES = ("none", "fp16", "bf16", "int8", "sign", "threshold", "top-k 1%", "random-k 1%",
         "PowerSGD r2")
OVERLAP_NAMES = ("none", "top-k 1%", "PowerSGD r2")
WARM_UP_STEPS = 2
SMALL_BUCKET_MB = 0.01
TORCH_HOOKS = ("none", "fp16", "PowerSGD r2")
LR, MOMENTUM = 0.01, 0.9
TRACED_STEPS = 3
#: distinct batches per rank, cycled. Enough that the models do not memorize
#: them within a run: a memorized batch has tiny gradients, and NumPy's
#: float16 arithmetic gets several times slower on subnormal values
DISTINCT_BATCHES = {"mlp": 16, "cnn": 16, "mlp1000": 64}
BANDWIDTHS = (10e9, 1e9, 100e6, 10e6, 1e6)   # bit/s, the sweep


# ------------------------------------------------------------------ models and data
def make_model(model_name: str, seed: int = 0):
    from minidist import nn
    from minidist.train import build_model

    if model_name == "mlp1000":
        nn.init.manual_seed(seed)
        return nn.Sequential(nn.Linear(1000, 500), nn.ReLU(), nn.Linear(500, 10))
    return build_model(model_name, seed)


def torch_model(model_name: str):
    import torch
    from torch import nn

    torch.manual_seed(0)
    if model_name == "mlp":
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    if model_name == "cnn":
        return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                             nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(),
                             nn.Linear(64, 10))
    return nn.Sequential(nn.Linear(1000, 500), nn.ReLU(), nn.Linear(500, 10))


def rank_batches(model_name: str, rank: int, world: int):
    """This rank's DISTINCT_BATCHES[model_name] (x float32, y int64) batches, cycled."""
    batch, count = PER_RANK_BATCH[model_name], DISTINCT_BATCHES[model_name]
    if model_name == "mlp1000":
        rng = np.random.default_rng([1000, rank])
        return [(rng.standard_normal((batch, 1000)).astype(np.float32),
                 rng.integers(0, 10, batch).astype(np.int64)) for _ in range(count)]
    from minidist.data import load_digits

    x, y = load_digits(flatten=model_name == "mlp")[:2]
    out = []
    for i in range(count):
        lo = (i * world + rank) * batch
        out.append((np.ascontiguousarray(x[lo:lo + batch], np.float32).copy(),
                    y[lo:lo + batch].astype(np.int64).copy()))
    return out


def parameter_shapes(model_name: str) -> list[tuple]:
    """In DDP's bucket order (reversed), as ``experiments.compression.parameter_shapes``."""
    return [p.data.shape for p in make_model(model_name).parameters()][::-1]


# ------------------------------------------------------------------ the steps
def minidist_step(model_name, batches, name=None, bucket_mb=25.0, overlap=True, seed=0):
    """A step function: DDP with compressor ``name`` (None: no DDP, the local step)."""
    from minidist import Tensor, nn, optim
    from minidist.experiments.compression import COMPRESSORS
    from minidist.parallel.data.ddp import DistributedDataParallel

    model = make_model(model_name)
    loss_fn = nn.CrossEntropyLoss()
    if name is None:
        wrapped = model
    else:
        wrapped = DistributedDataParallel(model, bucket_cap_mb=bucket_mb, algorithm="ring",
                                          overlap=overlap)
        if name != "none":  # "none": DDP's own path (allreduce_hook is the same, bit for bit)
            wrapped.register_comm_hook(COMPRESSORS[name].state(seed), COMPRESSORS[name].hook)
    optimizer = optim.SGD(wrapped.parameters(), lr=LR, momentum=MOMENTUM)

    def step(index):
        x, y = batches[index % len(batches)]
        optimizer.zero_grad(set_to_none=False)
        loss_fn(wrapped(Tensor(x)), y).backward()
        optimizer.step()

    step.buckets = len(wrapped.buckets) if name is not None else 0
    return step


def torch_step(model_name, batches, hook):
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD

    ddp = torch.nn.parallel.DistributedDataParallel(torch_model(model_name))
    if hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "PowerSGD r2":
        state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                       start_powerSGD_iter=2, random_seed=0)
        ddp.register_comm_hook(state, powerSGD.powerSGD_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = torch.nn.CrossEntropyLoss()
    tensors = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches]

    def step(index):
        x, y = tensors[index % len(tensors)]
        optimizer.zero_grad()
        loss_fn(ddp(x), y).backward()
        optimizer.step()

    return step


# ------------------------------------------------------------------ launch 1: the trace
def traced_worker(models):
    import minidist.distributed as dist
    from minidist import trace
    from minidist.runtime.blas_threads import set_blas_threads

    set_blas_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    for model_name in models:
        batches = rank_batches(model_name, rank, world)
        for name in NAMES:
            step = minidist_step(model_name, batches, name)
            # Two warm-up steps: PowerSGD all-reduces plainly for its first
            # start_powerSGD_iter = 2 steps (torch's rule), and is measured after.
            for index in range(WARM_UP_STEPS):
                step(index)
            dist.barrier()
            # the label bytes_per_step reads: "compressor NAME|SEED" (here the model's index)
            with trace.region(f"compressor {name}|{MODELS.index(model_name)}"):
                for index in range(WARM_UP_STEPS, WARM_UP_STEPS + TRACED_STEPS):
                    step(index)
    return rank


def traced_counts(events, models, rank=0):
    """{model: {name: (bytes per step, messages per step)}} of ``rank``."""
    from minidist.experiments.compression import bytes_per_step

    sent = bytes_per_step(events, rank)
    regions = {tuple(e["label"].split(" ", 1)[1].rsplit("|", 1)): (e["start"], e["end"])
               for e in events if e["rank"] == rank and e["kind"] == "compute"
               and e["label"].startswith("compressor ")}
    sends = [e for e in events if e["rank"] == rank and e["kind"] == "send"]
    out = {}
    for model_name in models:
        key = MODELS.index(model_name)
        out[model_name] = {}
        for name in NAMES:
            begin, end = regions[(name, str(key))]
            messages = sum(1 for e in sends if begin <= e["start"] <= end)
            out[model_name][name] = (sent[(name, key)] / TRACED_STEPS, messages / TRACED_STEPS)
    return out


# ------------------------------------------------------------------ launch 2: the timing
def timed_worker(models, steps, windows, rendezvous):
    import minidist.distributed as dist
    from minidist.runtime.blas_threads import set_blas_threads

    set_blas_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    if rendezvous is not None:
        import torch
        import torch.distributed as tdist

        torch.set_num_threads(1)
        tdist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                                 world_size=world)
    results = {}
    for model_name in models:
        batches = rank_batches(model_name, rank, world)
        steppers = {("local", None): minidist_step(model_name, batches, None)}
        for name in NAMES:
            steppers[("minidist", name)] = minidist_step(model_name, batches, name)
        for name in OVERLAP_NAMES:
            for overlap in (True, False):
                steppers[(f"overlap {'on' if overlap else 'off'}", name)] = minidist_step(
                    model_name, batches, name, bucket_mb=SMALL_BUCKET_MB, overlap=overlap)
        if rendezvous is not None:
            for hook in TORCH_HOOKS:
                steppers[("torch", hook)] = torch_step(model_name, batches, hook)
        keys = list(steppers)
        for key in keys:  # warm-up (torch's PowerSGD compresses from its 3rd step)
            for index in range(3):
                steppers[key](index)
        times = {key: [] for key in keys}
        for window in range(windows):
            shift = (window * 5) % len(keys)
            for key in keys[shift:] + keys[:shift]:
                dist.barrier()
                start = time.perf_counter()
                for index in range(steps):
                    steppers[key](index)
                times[key].append((time.perf_counter() - start) / steps)
        buckets = {name: steppers[("overlap on", name)].buckets for name in OVERLAP_NAMES}
        results[model_name] = {"times": {f"{kind}|{name}": t for (kind, name), t in times.items()},
                               "buckets": buckets}
    if rendezvous is not None:
        tdist.destroy_process_group()
    return results


# ------------------------------------------------------------------ the model of a slow link
def crossover(local_c, m_c, s_c, local_n, m_n, s_n, alpha):
    """The bandwidth (bit/s) below which c beats none, as ("below", B),
    ("above", B), ("always", None) or ("never", None)."""
    extra = (local_c - local_n) + (m_c - m_n) * alpha   # c's extra time, bandwidth aside
    saved = 8.0 * (s_n - s_c)                            # bits c does not send
    if saved > 0:
        return ("always", None) if extra <= 0 else ("below", saved / extra)
    if saved < 0:
        return ("never", None) if extra >= 0 else ("above", saved / extra)
    return ("always", None) if extra < 0 else ("never", None)


def human_bits(b: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.3g} bit/s"


def print_table(header, rows) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))


def analyse(model_name, timed, counts, windows, alpha, world):
    """Print this model's tables and return its record for the JSON."""
    from minidist.alpha_beta import PARAMS
    from minidist.experiments.compression import formula_bytes

    shm = PARAMS["shm"]
    slowest = {key: [max(r["times"][key][w] for r in timed) for w in range(windows)]
               for key in timed[0]["times"]}
    ms = {key: statistics.median(v) * 1e3 for key, v in slowest.items()}
    rng = {key: (min(v) * 1e3, max(v) * 1e3) for key, v in slowest.items()}
    shapes = parameter_shapes(model_name)
    psi = sum(int(np.prod(s)) for s in shapes)
    have_torch = any(key.startswith("torch|") for key in ms)
    none = ms["minidist|none"]
    record = {"parameters": psi, "per_rank_batch": PER_RANK_BATCH[model_name],
              "local_ms": ms["local|None"], "compressors": {}, "overlap": {}, "torch": {}}

    print(f"\n=== {model_name}: {psi:,} parameters, {PER_RANK_BATCH[model_name]} examples per "
          f"rank; local step (no DDP) {ms['local|None']:.3f} ms "
          f"[{rng['local|None'][0]:.3f}-{rng['local|None'][1]:.3f}]")
    header = ["compressor", "ms/step", "range", "vs none", "bytes/step (trace)", "(formula)",
              "msgs/step"]
    if have_torch:
        header += ["torch ms/step", "minidist / torch"]
    rows = []
    for name in NAMES:
        key = f"minidist|{name}"
        s, m = counts[name]
        formula = formula_bytes(name, shapes, world)
        row = [name, f"{ms[key]:.3f}", f"{rng[key][0]:.3f}-{rng[key][1]:.3f}",
               f"{ms[key] / none:.2f}x", f"{s:,.0f}", "-" if formula is None else f"{formula:,.0f}",
               f"{m:g}"]
        entry = {"ms": ms[key], "range_ms": rng[key], "vs_none": ms[key] / none,
                 "bytes_per_step": s, "formula_bytes": formula, "messages_per_step": m}
        if have_torch:
            tkey = f"torch|{name}"
            if tkey in ms:
                row += [f"{ms[tkey]:.3f}", f"{ms[key] / ms[tkey]:.2f}x"]
                entry["torch_ms"], entry["over_torch"] = ms[tkey], ms[key] / ms[tkey]
                record["torch"][name] = {"ms": ms[tkey], "range_ms": rng[tkey],
                                         "vs_none": ms[tkey] / ms["torch|none"]}
            else:
                row += ["", ""]
        rows.append(row)
        record["compressors"][name] = entry
    print_table(header, rows)
    if have_torch:
        print("torch vs its own none: " + ", ".join(
            f"{h} {ms[f'torch|{h}'] / ms['torch|none']:.2f}x" for h in TORCH_HOOKS))

    buckets = timed[0]["buckets"]
    print(f"\noverlap, bucket_mb={SMALL_BUCKET_MB} ({', '.join(f'{n}: {b} buckets' for n, b in buckets.items())})")
    rows = []
    for name in OVERLAP_NAMES:
        on, off = ms[f"overlap on|{name}"], ms[f"overlap off|{name}"]
        rows.append([name, f"{on:.3f}", f"{off:.3f}", f"{on / off:.2f}x"])
        record["overlap"][name] = {"on_ms": on, "off_ms": off, "on_over_off": on / off,
                                   "buckets": buckets[name]}
    print_table(["hook", "overlap on ms", "overlap off ms", "on / off"], rows)

    print(f"\nslow link (modelled: alpha {alpha * 1e6:g} us, full duplex, no overlap); "
          f"local = measured step - shm wire (alpha {shm.alpha * 1e6:g} us, "
          f"{1 / shm.beta / 1e9:.1f} GB/s); step ms at B:")
    s_n, m_n = counts["none"]
    local = {name: ms[f"minidist|{name}"] / 1e3 - counts[name][1] * shm.alpha
             - counts[name][0] * shm.beta for name in NAMES}
    rows = []
    for name in NAMES:
        s, m = counts[name]
        t = [local[name] + m * alpha + 8 * s / b for b in BANDWIDTHS]
        t_none = [local["none"] + m_n * alpha + 8 * s_n / b for b in BANDWIDTHS]
        kind, where = crossover(local[name], m, s, local["none"], m_n, s_n, alpha)
        cross = kind if where is None else f"{kind} {human_bits(where)}"
        rows.append([name, f"{local[name] * 1e3:.3f}", f"{(local[name] - local['none']) * 1e3:+.3f}",
                     *(f"{x * 1e3:.3g} ({x / y:.2f}x)" for x, y in zip(t, t_none)), cross])
        record["compressors"][name].update({
            "local_ms": local[name] * 1e3, "codec_ms": (local[name] - local["none"]) * 1e3,
            "modelled_ms": {str(b): x * 1e3 for b, x in zip(BANDWIDTHS, t)},
            "crossover": {"kind": kind, "bits_per_s": where}})
    print_table(["compressor", "local ms", "codec ms",
                 *(human_bits(b) for b in BANDWIDTHS), "wins vs none"], rows)
    return record


# ------------------------------------------------------------------ driver
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: few steps, 1 window")
    parser.add_argument("--models", default=",".join(MODELS), help="mlp, cnn, mlp1000 (all)")
    parser.add_argument("--steps", type=int, default=None, help="steps per window (20; quick 2)")
    parser.add_argument("--windows", type=int, default=None, help="rounds (9; quick 1)")
    parser.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    parser.add_argument("--alpha-us", type=float, default=50.0,
                        help="the modelled slow link's latency per message (default 50 us)")
    parser.add_argument("--json", default=os.path.join(HERE, "results", "compression.json"),
                        help="where to write the results ('' for nowhere)")
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",")]
    for name in models:
        if name not in MODELS:
            parser.error(f"unknown model {name!r}: choose from {', '.join(MODELS)}")
    steps = args.steps or (2 if args.quick else 20)
    windows = args.windows or (1 if args.quick else 9)
    alpha = args.alpha_us * 1e-6

    import minidist
    from minidist import trace
    from minidist.bench.common import machine

    world = 2
    torch_version = None
    if not args.no_torch:
        if importlib.util.find_spec("torch") is None:
            print("PyTorch is not installed: its columns are left out (pip install torch)")
        else:
            torch_version = importlib.metadata.version("torch")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "compression.jsonl")
        minidist.launch(traced_worker, args=(models,), world_size=world, transport="shm",
                        trace=path, timeout=300)
        counts = traced_counts(trace.read_jsonl(path).events, models)
        rendezvous = os.path.join(folder, "rendezvous") if torch_version else None
        started = time.perf_counter()
        timed = minidist.launch(timed_worker, args=(models, steps, windows, rendezvous),
                                world_size=world, transport="shm", timeout=600)
        elapsed = time.perf_counter() - started
    print(f"gradient compression, {world} processes (shm, ring, 1 BLAS thread each), SGD "
          f"momentum; median of {windows} windows of {steps} steps (slowest rank), all "
          f"configurations interleaved" + (f", PyTorch {torch_version} gloo" if torch_version
                                           else "") + f"; timing launch took {elapsed:.1f} s")
    records = {name: analyse(name, [r[name] for r in timed], counts[name], windows, alpha, world)
               for name in models}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump({"benchmark": "gradient compression", "machine": machine(),
                       "torch": torch_version, "quick": args.quick,
                       "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
                       "settings": {"steps": steps, "windows": windows, "world_size": world,
                                    "lr": LR, "momentum": MOMENTUM, "algorithm": "ring",
                                    "per_rank_batch": PER_RANK_BATCH,
                                    "small_bucket_mb": SMALL_BUCKET_MB,
                                    "link_alpha_s": alpha, "bandwidths_bit_s": BANDWIDTHS,
                                    "blas_threads_per_worker": 1},
                       "results": records}, handle, indent=2)
        print(f"\nresults written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
