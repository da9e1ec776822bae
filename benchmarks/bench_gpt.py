"""Time one GPT training step (forward, cross-entropy, backward, AdamW step)
in minidist and in PyTorch CPU, same model, same weights, same batch, same
thread count, and report each one's achieved flop/s and MFU.

The model is the course's GPT (``minidist.models.gpt``; by default the shape
``minidist train --model gpt`` trains: 4 layers, 4 heads, width 128, context
64, batch 12, the 62 characters of the bundled Shakespeare), written a second
time in torch below with the same layout and names (nanoGPT's), and loaded
with minidist's initial weights by name, so both compute the same function
(the first losses are checked to agree before any timing). Attention is
``scaled_dot_product_attention(is_causal=True)`` on both sides; torch may run
its fused CPU kernel there, minidist computes the full T x T scores.

Flops per step are counted from the configuration (:mod:`minidist.flops`:
6 N B T + 12 n_layer d T B T, the matrix products only), the same figure for
both; MFU is that over the step time over the machine's GEMM peak, measured
in the same run on the same thread count: the best float32 square product of
NumPy's BLAS and of torch's (each is printed).

Usage:
  python benchmarks/bench_gpt.py [--threads 1] [--repeats 20] [--steps 3]
                                 [--n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --batch 12]
                                 [--clock wall|cpu] [--json out.json]
  OPENBLAS_CORETYPE=Haswell python benchmarks/bench_gpt.py     # NumPy's OpenBLAS on its Haswell kernels

The two take turns (``--steps`` steps each per round, median over
``--repeats`` rounds, after warm-up), as in bench_training_step.py. The
OpenBLAS kernel family NumPy runs is named in the output: it decides
minidist's GEMM speed (torch brings its own BLAS).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _limit_threads(threads: int):
    # Must happen before NumPy or PyTorch load their thread pools.
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)


def interleaved_medians(steps: dict, repeats: int, steps_per_round: int, warmup: int = 3,
                        clock=time.perf_counter) -> dict:
    """Median seconds per step of each of ``steps`` (name -> callable), in turns."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    times = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = clock()
            for _ in range(steps_per_round):
                step()
            times[name].append((clock() - start) / steps_per_round)
    return {name: sorted(values)[len(values) // 2] for name, values in times.items()}


# ----------------------------------------------------------------- minidist
def minidist_gpt(config, seed):
    from minidist.models.gpt import GPT

    return GPT(config, rng=seed)


def minidist_step(model, x, y):
    from minidist import optim
    from minidist.nn import functional as F

    optimizer = optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    vocab = model.config.vocab_size

    def step():
        loss = F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    return step


# ------------------------------------------------------------------ PyTorch
def torch_gpt(config, weights):
    """The same GPT in torch (nanoGPT's layout and names), loaded with
    ``weights`` ({name: array}, minidist's)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
            self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)

        def forward(self, x):
            batch, steps, width = x.shape
            q, k, v = self.c_attn(x).split(width, dim=2)
            q, k, v = (t.view(batch, steps, config.n_head, width // config.n_head).transpose(1, 2)
                       for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(batch, steps, width))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
            self.gelu = nn.GELU(approximate=config.gelu)
            self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

        def forward(self, x):
            return self.c_proj(self.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
            self.attn = CausalSelfAttention()
            self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                h=nn.ModuleList([Block() for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            ))
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
            self.lm_head.weight = self.transformer.wte.weight  # tied

        def forward(self, idx):
            t = self.transformer
            x = t.wte(idx) + t.wpe(torch.arange(idx.shape[1]))
            for block in t.h:
                x = block(x)
            return self.lm_head(t.ln_f(x))

    model = GPT()
    state = model.state_dict()
    weights = dict(weights)  # minidist names the tied matrix once, torch's state_dict twice
    weights.setdefault("lm_head.weight", weights["transformer.wte.weight"])
    missing = set(state) - set(weights)
    if missing:
        raise RuntimeError(f"bench_gpt: torch parameters without a minidist twin: {sorted(missing)}")
    model.load_state_dict({name: torch.from_numpy(weights[name].copy()) for name in state})
    return model


def torch_step(model, x, y):
    import torch
    from torch.nn import functional as F

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    x, y = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    return step


def torch_gemm_peak(size: int = 2048, repeats: int = 5, clock=time.perf_counter) -> float:
    """torch's float32 square product, best of ``repeats`` (its own BLAS)."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    out = torch.empty(size, size)
    torch.matmul(a, b, out=out)
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        torch.matmul(a, b, out=out)
        best = min(best, clock() - start)
    return 2 * size ** 3 / best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20, help="rounds (median over them)")
    parser.add_argument("--steps", type=int, default=3, help="steps of one framework per turn")
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--vocab-size", type=int, default=62, help="62: the bundled Shakespeare's characters")
    parser.add_argument("--batch", type=int, default=12)
    parser.add_argument("--gelu", choices=["none", "tanh"], default="none")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall time, or the process's CPU time (a shared machine, --threads 1)")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    _limit_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.process_time

    from minidist.runtime.allocator import keep_freed_memory

    keep_freed_memory()  # as minidist train does (see bench_training_step.py)

    import numpy as np

    from minidist import flops
    from minidist.bench.common import machine
    from minidist.models.gpt import GPTConfig
    from minidist.runtime.blas_threads import openblas_cores

    try:
        import torch
    except ImportError:
        sys.exit("bench_gpt: PyTorch is not installed; install the CPU build "
                 "(see benchmarks/README.md, Setup) to compare against it")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    config = GPTConfig(vocab_size=args.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                       n_head=args.n_head, n_embd=args.n_embd, gelu=args.gelu)
    rng = np.random.default_rng(0)
    x = rng.integers(0, config.vocab_size, (args.batch, config.block_size))
    y = rng.integers(0, config.vocab_size, (args.batch, config.block_size))

    ours = minidist_gpt(config, seed=0)
    theirs = torch_gpt(config, {name: p.data for name, p in ours.named_parameters()})
    steps = {"minidist": minidist_step(ours, x, y), "torch": torch_step(theirs, x, y)}
    first = {name: float(step().item()) for name, step in steps.items()}
    if abs(first["minidist"] - first["torch"]) > 1e-4 * abs(first["torch"]):
        raise RuntimeError(f"bench_gpt: the two models disagree before timing: losses {first}")

    medians = interleaved_medians(steps, args.repeats, args.steps, clock=clock)
    counted = flops.gpt_step_flops(config, args.batch)
    peaks = {"numpy": flops.measure_gemm_peak(threads=args.threads, clock=clock),
             "torch": torch_gemm_peak(clock=clock)}
    peak = max(peaks.values())
    kernels = ", ".join(openblas_cores()) or "not OpenBLAS"
    result = {
        "machine": machine(), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
        "openblas_kernels": kernels, "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
        "threads": args.threads, "clock": args.clock, "repeats": args.repeats, "steps_per_turn": args.steps,
        "config": {"n_layer": config.n_layer, "n_head": config.n_head, "n_embd": config.n_embd,
                   "block_size": config.block_size, "vocab_size": config.vocab_size, "batch": args.batch,
                   "gelu": config.gelu},
        "flops_per_step": counted.total, "gemm_peak_flops": peaks,
        "minidist_ms": 1e3 * medians["minidist"], "torch_ms": 1e3 * medians["torch"],
        "ratio": medians["minidist"] / medians["torch"],
    }
    for name in ("minidist", "torch"):
        result[f"{name}_gflops"] = flops.achieved(counted.total, medians[name]) / 1e9
        result[f"{name}_mfu"] = flops.mfu(counted.total, medians[name], peak)

    print(f"GPT {config.n_layer} layers, {config.n_head} heads, width {config.n_embd}, context "
          f"{config.block_size}, vocab {config.vocab_size}, batch {args.batch}, float32, "
          f"{args.threads} thread(s), {args.clock} clock, median of {args.repeats} rounds of "
          f"{args.steps} steps; NumPy's OpenBLAS kernels: {kernels}; torch {torch.__version__}")
    print(f"flops per step {counted.total / 1e9:.3f} G (dense {counted.dense / 1e9:.3f}, attention "
          f"{counted.attention / 1e9:.3f}); GEMM peak {args.threads} thread(s): NumPy "
          f"{peaks['numpy'] / 1e9:.1f}, torch {peaks['torch'] / 1e9:.1f} GFLOP/s")
    for name in ("minidist", "torch"):
        print(f"  {name:8s} {result[f'{name}_ms']:8.2f} ms  {result[f'{name}_gflops']:6.2f} GFLOP/s  "
              f"MFU {100 * result[f'{name}_mfu']:5.1f} %")
    print(f"  minidist / torch: {result['ratio']:.2f}x")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)
    return result


if __name__ == "__main__":
    main()
