"""Record PyTorch's logits, loss and gradients for a tiny GPT into
tests/data/torch_reference/gpt.npz.

The torch model below is minidist.models.GPT written in torch (nanoGPT's
layout and parameter names, exact GELU, F.scaled_dot_product_attention with
is_causal=True, lm_head tied to wte). Both models get the same parameters,
drawn here by name from numpy.random.default_rng(35) (N(0, 0.3): values
far from the initial ones, so no term vanishes), run the same token ids,
and their losses and every parameter's gradient must agree:
tests/core/test_gpt.py compares minidist against this file on every
machine, and against live torch where it is installed (calling ``record``).
Run it again only when the case changes:

    .venv/bin/python scripts/record_torch_gpt.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "torch_reference" / "gpt.npz"
DTYPES = ("float32", "float64")
CONFIG = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=12)
BATCH, STEPS = 3, 7


def parameter_shapes() -> dict:
    """nanoGPT's names and torch's (out, in) shapes, in minidist's order."""
    c, v, t = CONFIG["n_embd"], CONFIG["vocab_size"], CONFIG["block_size"]
    shapes = {"transformer.wte.weight": (v, c), "transformer.wpe.weight": (t, c)}
    for layer in range(CONFIG["n_layer"]):
        p = f"transformer.h.{layer}."
        shapes.update({
            p + "ln_1.weight": (c,), p + "ln_1.bias": (c,),
            p + "attn.c_attn.weight": (3 * c, c), p + "attn.c_attn.bias": (3 * c,),
            p + "attn.c_proj.weight": (c, c), p + "attn.c_proj.bias": (c,),
            p + "ln_2.weight": (c,), p + "ln_2.bias": (c,),
            p + "mlp.c_fc.weight": (4 * c, c), p + "mlp.c_fc.bias": (4 * c,),
            p + "mlp.c_proj.weight": (c, 4 * c), p + "mlp.c_proj.bias": (c,),
        })
    shapes.update({"transformer.ln_f.weight": (c,), "transformer.ln_f.bias": (c,)})
    return shapes


def inputs() -> dict:
    """The parameters (float64, by name) and the token ids and targets."""
    rng = np.random.default_rng(35)
    x = {f"param/{name}": rng.normal(0.0, 0.3, shape) for name, shape in parameter_shapes().items()}
    for name in x:
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            x[name] += 1.0  # gains around one, as trained LayerNorms have
    x["idx"] = rng.integers(0, CONFIG["vocab_size"], size=(BATCH, STEPS))
    x["targets"] = rng.integers(0, CONFIG["vocab_size"], size=(BATCH, STEPS))
    return x


def torch_gpt(dtype):
    """minidist.models.GPT in torch, with the parameters of :func:`inputs`."""
    import torch
    import torch.nn as tnn
    import torch.nn.functional as F

    c, heads = CONFIG["n_embd"], CONFIG["n_head"]

    class Attention(tnn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = tnn.Linear(c, 3 * c)
            self.c_proj = tnn.Linear(c, c)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.c_attn(x).split(c, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).reshape(b, t, c))

    class MLP(tnn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = tnn.Linear(c, 4 * c)
            self.gelu = tnn.GELU()
            self.c_proj = tnn.Linear(4 * c, c)

        def forward(self, x):
            return self.c_proj(self.gelu(self.c_fc(x)))

    class Block(tnn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn, self.ln_2, self.mlp = tnn.LayerNorm(c), Attention(), tnn.LayerNorm(c), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(tnn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = tnn.ModuleDict(dict(
                wte=tnn.Embedding(CONFIG["vocab_size"], c), wpe=tnn.Embedding(CONFIG["block_size"], c),
                h=tnn.ModuleList([Block() for _ in range(CONFIG["n_layer"])]), ln_f=tnn.LayerNorm(c)))
            self.lm_head = tnn.Linear(c, CONFIG["vocab_size"], bias=False)
            self.lm_head.weight = self.transformer.wte.weight

        def forward(self, idx):
            t = self.transformer
            x = t.wte(idx) + t.wpe(torch.arange(idx.shape[1]))
            for block in t.h:
                x = block(x)
            return self.lm_head(t.ln_f(x))

    model = GPT().to(dtype)
    params = {name[len("param/"):]: value for name, value in inputs().items() if name.startswith("param/")}
    state = {name: torch.tensor(value, dtype=dtype) for name, value in params.items()}
    state["lm_head.weight"] = state["transformer.wte.weight"]
    model.load_state_dict(state)
    return model


def record(dtype: str) -> dict:
    """torch's logits, loss and the gradient of every parameter, in ``dtype``."""
    import torch
    import torch.nn.functional as F

    model = torch_gpt(getattr(torch, dtype))
    x = inputs()
    logits = model(torch.tensor(x["idx"]))
    loss = F.cross_entropy(logits.reshape(-1, CONFIG["vocab_size"]), torch.tensor(x["targets"]).reshape(-1))
    loss.backward()
    out = {f"logits/{dtype}": logits.detach().numpy(), f"loss/{dtype}": loss.detach().numpy()}
    for name, param in model.named_parameters():  # the tied matrix once, as transformer.wte.weight
        out[f"grad/{name}/{dtype}"] = param.grad.numpy()
    return out


def main():
    import torch

    results = {f"input/{name}": value for name, value in inputs().items()}
    for dtype in DTYPES:
        results.update(record(dtype))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **results)
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes) with torch {torch.__version__}")


if __name__ == "__main__":
    main()
