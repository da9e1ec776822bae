"""Bytes against loss: DDP, local SGD and DiLoCo at H = 4 and 16, on 2 processes.

For the small GPT (character-level Shakespeare) and the digits CNN, each
with AdamW as the (inner) optimizer, every method trains from the same
weights on the same batches (minidist.experiments.low_communication's
recipe; DiLoCo's outer step SGD lr 0.7, Nesterov momentum 0.9):

  DDP            the gradients all-reduced every step (ring, no overlap)
  local_sgd H    the weights averaged every H steps (Stich 2019; Lin et al. 2020)
  diloco H       H inner steps, then the outer Nesterov step on the averaged
                 pseudo-gradient (Douillard et al. 2023)

Measured: the bytes each rank sent to reach a target loss (held-out loss at
the method's sync points, the bytes read from the trace), and the wall time
of a training step. A round is one launch per model (2 ranks, shm) with the
methods trained one after another, their order rotating from round to
round; the table gives, per method, the median over the rounds of each
round's ratio to DDP's time per step (a ratio of neighbours cancels most of
what other work on the machine does to both), with its range. The training
is deterministic: the losses, hence the steps and the bytes to the target,
are the same in every round (checked).

The target: DDP's held-out loss half-way through its run (the same in
every round); a method that does not reach it within the run says "-".

Usage:
  python benchmarks/bench_low_communication.py [--rounds 3] [--json out.json]
  python benchmarks/bench_low_communication.py --quick          # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's minidist, installed or not

MODELS = ("gpt", "cnn")


def recipe(model: str, quick: bool) -> dict:
    """The experiment's quick recipe, or its full models and steps at H = 4, 16."""
    from minidist.experiments import low_communication as lc

    if quick:
        return lc.configuration(model, quick=True)
    config = dict(lc.configuration(model, quick=False))
    config.update(steps=256, sync_every=(4, 16))
    return config


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="the experiment's quick recipe, 1 round")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 3; quick 1)")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)

    from minidist.bench.common import machine
    from minidist.experiments import low_communication as lc

    record = {"machine": machine(), "rounds": rounds, "models": {}}
    for model in MODELS:
        config = recipe(model, args.quick)
        names = [m.name for m in lc.methods(config["sync_every"])]
        found, target = [], None
        for index in range(rounds):
            shift = index % len(names)
            result = lc.measure(model, config=config, order=names[shift:] + names[:shift])
            if target is None:          # DDP's loss half-way through its run
                ddp = result.runs["ddp"]
                target = ddp.loss[ddp.steps.index(config["steps"] // 2)]
            found.append(lc.apply_target(result, target))
            print(f"{model} round {index + 1}/{rounds}: " + ", ".join(
                f"{name} {1e3 * run.seconds_per_step:.2f} ms" for name, run
                in result.runs.items()), flush=True)
        first = found[0]
        for other in found[1:]:                 # deterministic training: the same losses
            for name in names:
                if other.runs[name].loss != first.runs[name].loss:
                    raise RuntimeError(f"{model} {name}: the losses differ between rounds")
        ddp = first.runs["ddp"]
        rows = {}
        for name in names:
            run = first.runs[name]
            ratios = [r.runs[name].seconds_per_step / r.runs["ddp"].seconds_per_step
                      for r in found]
            rows[name] = {
                "bytes_per_step": run.bytes_per_step,
                "bytes_ratio": run.bytes_per_step / ddp.bytes_per_step,
                "steps_to_target": run.steps_to_target,
                "bytes_to_target": run.bytes_to_target,
                "bytes_to_target_ratio": (None if run.bytes_to_target is None
                                          else run.bytes_to_target / ddp.bytes_to_target),
                "ms_per_step": [1e3 * r.runs[name].seconds_per_step for r in found],
                "time_ratio_median": statistics.median(ratios),
                "time_ratio_range": [min(ratios), max(ratios)],
                "beats_ddp_below": first.beats_ddp_below.get(name),
            }
        record["models"][model] = {
            "parameters": first.parameters, "steps": config["steps"],
            "target_loss": first.target_loss, "methods": rows,
            "crossovers": [(c.below, c.above, c.bandwidth) for c in first.crossovers],
            "fastest": first.fastest}
        print(f"\n{model}: {first.parameters:,} parameters, {config['steps']} steps, target "
              f"loss {first.target_loss:.3f}, median of {rounds} rounds")
        print(f"{'method':<14} {'bytes/step':>11} {'/ DDP':>6} {'steps':>6} "
              f"{'bytes to target':>16} {'/ DDP':>6} {'ms/step':>8} {'/ DDP [range]':>20} "
              f"{'beats DDP below':>16}")
        for name, row in rows.items():
            low, high = row["time_ratio_range"]
            below = "" if name == "ddp" else lc.format_bandwidth(row["beats_ddp_below"])
            to_target = "-" if row["bytes_to_target"] is None else f"{row['bytes_to_target']:,.0f}"
            ratio = "-" if row["bytes_to_target_ratio"] is None \
                else f"{row['bytes_to_target_ratio']:.3f}"
            print(f"{name:<14} {row['bytes_per_step']:11,.0f} {row['bytes_ratio']:6.3f} "
                  f"{row['steps_to_target'] or '-':>6} {to_target:>16} {ratio:>6} "
                  f"{statistics.median(row['ms_per_step']):8.2f} "
                  f"{row['time_ratio_median']:6.2f} [{low:.2f}-{high:.2f}] {below:>16}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(record, file, indent=1, default=str)
        print("wrote", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
