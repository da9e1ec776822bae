"""Mixed precision on the digits MLP: what loss scaling prevents, and that
float16 compute with float32 master weights learns as float32 does.

**Underflow** (:func:`gradient_underflow`): the MLP is trained in float32
for a few epochs (late in training, when most examples are classified
well, their gradients are tiny), then the gradient of the mean loss over
the whole training set is computed three ways: in float64 (the reference),
and in float16 with the loss scaled by ``S`` for each ``S`` of ``scales``
(``S = 1``: no scaling). Counted, per scale: the entries of the activation
gradients (each layer's output) and of the weight gradients that are
nonzero in the reference but exactly zero in float16, i.e. that
*underflowed*: float16 flushes to zero everything below 2^-25 (half its
smallest subnormal, 2^-24 = 6e-8). A logit's gradient is
``(softmax - onehot) / N``; with N = 1442 examples and a confident softmax
it is far below that. The scaled run uses :class:`~minidist.amp.GradScaler`
and :class:`~minidist.amp.MasterWeights` as training does: scale, backward
in float16, copy the gradients to float32, unscale there.

**Loss curves** (:func:`loss_curves`): the same MLP, seed and batches,
trained in float32 and in mixed precision (float16 model, float32 masters,
GradScaler with torch's defaults); the mean training loss per epoch of
each, the steps GradScaler skipped and its final scale.

Cost: float16 matrix products in NumPy have no BLAS behind them (an
element-by-element loop, many times slower than float32's), so a mixed
precision epoch costs more than a float32 one here; on a GPU it is the
other way round. The reduced form runs in seconds.

``python -m minidist.experiments.mixed_precision [--full]`` prints both.
"""

from __future__ import annotations

import sys

import numpy

from minidist import Tensor, amp, optim
from minidist.data import DataLoader, load_digits
from minidist.experiments.arguments import experiment_parser
from minidist.nn import functional as F
from minidist.train import build_model


def _pretrained_mlp(epochs: int, seed: int):
    """The digits MLP after ``epochs`` of float32 SGD, and the training set."""
    x, y, _, _ = load_digits(flatten=True)
    model = build_model("mlp", seed)
    optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(epochs):
        for xb, yb in DataLoader((x, y), batch_size=64, shuffle=True, seed=seed + epoch):
            optimizer.zero_grad()
            F.cross_entropy(model(Tensor(xb)), yb).backward()
            optimizer.step()
    return model, x, y


def _gradients(model, x, y, scaler=None, masters=None):
    """``(activation gradients, weight gradients)`` of the mean loss over
    (x, y), as float64 arrays, unscaled. The activations are the outputs of
    each layer of the Sequential, in the model's dtype; the loss is taken in
    float32 (float64 for a float64 model)."""
    model.zero_grad()
    outputs, h = [], Tensor(x)
    for layer in model:
        h = layer(h)
        h.retain_grad()
        outputs.append(h)
    logits = h if h.dtype == numpy.float64 else h.astype(numpy.float32)
    loss = F.cross_entropy(logits, y)
    if scaler is None:
        loss.backward()
        weights = [p.grad for p in model.parameters()]
        inv_scale = 1.0
    else:
        scaler.scale(loss).backward()
        masters.copy_grads_to_masters()
        optimizer = optim.SGD(masters.parameters(), lr=0.0)  # only to name the gradients
        scaler.unscale_(optimizer)
        weights = [p.grad for p in masters.parameters()]
        inv_scale = 1.0 / scaler.get_scale()
    activations = [o.grad.astype(numpy.float64) * inv_scale for o in outputs]
    return activations, [g.astype(numpy.float64) for g in weights]


def _underflowed(values, reference) -> tuple[int, int]:
    """``(entries zero in values but not in reference, nonzero in reference)``."""
    lost = sum(int(((v == 0) & (r != 0)).sum()) for v, r in zip(values, reference))
    return lost, sum(int((r != 0).sum()) for r in reference)


def gradient_underflow(epochs: int = 5, scales=(1.0, 2.0**8, 2.0**16), seed: int = 0) -> list[dict]:
    """One row per loss scale (see the module docstring): ``scale``,
    ``activation_underflowed`` of ``activation_entries``,
    ``weight_underflowed`` of ``weight_entries``, and ``relative_error``,
    the norm of the weight gradient's error against float64 over its norm."""
    model, x, y = _pretrained_mlp(epochs, seed)
    reference = build_model("mlp", seed).double()
    reference.load_state_dict(model.state_dict())
    reference_activations, reference_weights = _gradients(reference, x, y)
    rows = []
    for scale in scales:
        half = build_model("mlp", seed).half()
        half.load_state_dict(model.state_dict())
        scaler = amp.GradScaler(init_scale=float(scale))
        activations, weights = _gradients(half, x, y, scaler, amp.MasterWeights(half))
        act_lost, act_total = _underflowed(activations, reference_activations)
        weight_lost, weight_total = _underflowed(weights, reference_weights)
        error = numpy.sqrt(sum(((w - r) ** 2).sum() for w, r in zip(weights, reference_weights))
                           / sum((r ** 2).sum() for r in reference_weights))
        rows.append({"scale": float(scale), "activation_underflowed": act_lost,
                     "activation_entries": act_total, "weight_underflowed": weight_lost,
                     "weight_entries": weight_total, "relative_error": float(error)})
    return rows


def loss_curves(epochs: int = 5, lr: float = 0.1, batch_size: int = 64, seed: int = 0) -> dict:
    """``{"float32": [...], "mixed": [...]}`` mean training loss per epoch,
    plus ``"skipped"`` (steps GradScaler skipped) and ``"final_scale"``."""
    x, y, _, _ = load_digits(flatten=True)
    curves = {}
    for mode in ("float32", "mixed"):
        model = build_model("mlp", seed)
        if mode == "mixed":
            model.half()
            masters = amp.MasterWeights(model)
            optimizer = optim.SGD(masters.parameters(), lr=lr, momentum=0.9)
            scaler = amp.GradScaler()
        else:
            optimizer = optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        skipped, losses = 0, []
        for epoch in range(epochs):
            total, count = 0.0, 0
            for xb, yb in DataLoader((x, y), batch_size=batch_size, shuffle=True, seed=seed + epoch):
                model.zero_grad()
                logits = model(Tensor(xb)).astype(numpy.float32)
                loss = F.cross_entropy(logits, yb)
                if mode == "mixed":
                    scale = scaler.get_scale()
                    scaler.scale(loss).backward()
                    masters.copy_grads_to_masters()
                    scaler.step(optimizer)
                    scaler.update()
                    skipped += scaler.get_scale() < scale
                    masters.copy_masters_to_model()
                else:
                    loss.backward()
                    optimizer.step()
                total += float(loss.data) * len(yb)
                count += len(yb)
            losses.append(total / count)
        curves[mode] = losses
        if mode == "mixed":
            curves["skipped"] = int(skipped)
            curves["final_scale"] = scaler.get_scale()
    return curves


def main(argv=None) -> int:
    parser = experiment_parser("mixed_precision", "float16 gradients with and without loss "
                               "scaling; mixed precision against float32 on the digits MLP",
                               "30 epochs instead of 5")
    args = parser.parse_args(argv)
    epochs = 30 if args.full else 5
    print(f"Gradients of the digits MLP after {epochs} epochs, whole training set, float16 "
          "against float64: entries that underflowed to zero")
    print(f"{'loss scale':>12} {'activations':>22} {'weights':>18} {'gradient error':>15}")
    for row in gradient_underflow(epochs):
        print(f"{row['scale']:>12,.0f} "
              f"{row['activation_underflowed']:>8,} of {row['activation_entries']:>8,} "
              f"{row['weight_underflowed']:>6,} of {row['weight_entries']:>6,} "
              f"{row['relative_error']:>15.2e}")
    curves = loss_curves(epochs)
    print("\nMean training loss per epoch")
    print(f"{'epoch':>6} {'float32':>10} {'mixed':>10}")
    for epoch, (full, mixed) in enumerate(zip(curves["float32"], curves["mixed"])):
        print(f"{epoch + 1:>6} {full:>10.4f} {mixed:>10.4f}")
    print(f"GradScaler skipped {curves['skipped']} steps; final scale {curves['final_scale']:,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
