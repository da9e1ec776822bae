"""Record torch.amp.GradScaler's run on a fixed sequence of steps into
tests/data/torch_reference/grad_scaler.npz, for tests/core/test_amp.py.

Each case: two float32 parameters, a loss ``(w * c_t).sum() + (v * d_t).sum()``
whose gradients are exactly ``c_t`` and ``d_t``, scaled; some steps hold an
injected inf or NaN, some a value that only the scale makes overflow. SGD
with momentum steps them through ``scaler.step``; on some steps the script
calls ``scaler.unscale_`` first, as one does to clip. Recorded per step: the
scale before and after ``update()``, the growth tracker, whether the
optimizer stepped, the unscaled gradients and the parameters after it.

    python scripts/record_torch_amp.py      # needs torch (the CPU build is enough)

The test also runs :func:`run_torch` live when torch imports.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

OUTPUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "torch_reference" / "grad_scaler.npz"

#: name -> (GradScaler keyword arguments, number of steps, {step: injection})
CASES = {
    # torch's defaults but a short growth interval, so that growth shows.
    "default": (dict(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
                     growth_interval=3), 16,
                {2: "inf", 6: "nan", 7: "overflow", 8: "overflow", 10: "-inf"}),
    # Factors whose products round in float32: torch multiplies in float64.
    "odd_factors": (dict(init_scale=1000.0, growth_factor=1.7, backoff_factor=0.3,
                         growth_interval=2), 12,
                    {1: "nan", 5: "inf", 6: "inf"}),
    # The scale stops at float32's largest power of two instead of growing to inf.
    "ceiling": (dict(init_scale=2.0**125, growth_factor=2.0, backoff_factor=0.5,
                     growth_interval=1), 5, {}),
}
LR, MOMENTUM = 0.1, 0.9


def case_inputs(name: str) -> dict:
    """The arrays a case starts from, the same for torch and minidist."""
    kwargs, steps, injections = CASES[name]
    rng = np.random.default_rng(sorted(CASES).index(name))
    scale_of_grads = 1e-3 if name == "ceiling" else 1.0
    c = (rng.standard_normal((steps, 5)) * scale_of_grads).astype(np.float32)
    d = (rng.standard_normal((steps, 2, 3)) * scale_of_grads).astype(np.float32)
    for step, kind in injections.items():
        if kind == "overflow":  # finite, but times the scale beyond float32
            d[step, 1, 2] = np.float32(1e35)
        else:
            c[step, step % 5] = np.float32({"inf": np.inf, "-inf": -np.inf, "nan": np.nan}[kind])
    return {
        "c": c, "d": d,
        "w0": rng.standard_normal(5).astype(np.float32),
        "v0": rng.standard_normal((2, 3)).astype(np.float32),
        # unscale_ called by hand on every third step
        "explicit_unscale": np.arange(steps) % 3 == 1,
    }


def run_torch(name: str, inputs: dict) -> dict:
    """torch's scaler on ``inputs``: the per-step records named in the module docstring."""
    import torch

    kwargs, steps, _ = CASES[name]
    w = torch.nn.Parameter(torch.from_numpy(inputs["w0"].copy()))
    v = torch.nn.Parameter(torch.from_numpy(inputs["v0"].copy()))
    optimizer = torch.optim.SGD([w, v], lr=LR, momentum=MOMENTUM)
    stepped = []
    original_step = optimizer.step

    def counting_step(*args, **kw):
        stepped[-1] = True
        return original_step(*args, **kw)

    optimizer.step = counting_step
    scaler = torch.amp.GradScaler("cpu", **kwargs)
    records = {key: [] for key in ("scale_before", "scale_after", "growth_tracker", "stepped",
                                   "grad_w", "grad_v", "w", "v")}
    for step in range(steps):
        optimizer.zero_grad()
        stepped.append(False)
        c = torch.from_numpy(inputs["c"][step])
        d = torch.from_numpy(inputs["d"][step])
        loss = (w * c).sum() + (v * d).sum()
        records["scale_before"].append(scaler.get_scale())
        scaler.scale(loss).backward()
        if inputs["explicit_unscale"][step]:
            scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
        records["scale_after"].append(scaler.get_scale())
        records["growth_tracker"].append(scaler.state_dict()["_growth_tracker"])
        records["stepped"].append(stepped[-1])
        records["grad_w"].append(w.grad.detach().numpy().copy())
        records["grad_v"].append(v.grad.detach().numpy().copy())
        records["w"].append(w.detach().numpy().copy())
        records["v"].append(v.detach().numpy().copy())
    return {key: np.asarray(value) for key, value in records.items()}


def main():
    import torch

    arrays = {"torch_version": np.asarray(torch.__version__)}
    for name in CASES:
        inputs = case_inputs(name)
        for key, value in {**inputs, **run_torch(name, inputs)}.items():
            arrays[f"{name}/{key}"] = value
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUTPUT, **arrays)
    print(f"wrote {OUTPUT} ({OUTPUT.stat().st_size:,} bytes, torch {torch.__version__})")


if __name__ == "__main__":
    main()
