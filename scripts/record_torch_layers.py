"""Record PyTorch's outputs and gradients for the transformer layers
(Embedding, LayerNorm, GELU, scaled_dot_product_attention,
MultiheadAttention, cross_entropy with ignore_index, weight tying) on fixed
inputs, in float32 and float64, into tests/data/torch_reference/layers.npz.

tests/test_transformer_layers.py compares minidist against this file on
every machine, and against live torch where torch is installed (it calls
``record`` below). Run it again only when a case changes:

    .venv/bin/python scripts/record_torch_layers.py

Every case draws its inputs from numpy.random.default_rng(seed) in float64;
its scalar loss is sum(output * R) for a fixed random R, so that every
gradient is a non-trivial one. Keys are ``<case>/<name>``, with the
``/float32`` or ``/float64`` results side by side.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "torch_reference" / "layers.npz"
DTYPES = ("float32", "float64")


def inputs() -> dict:
    """The fixed inputs of every case (float64, or integer indices)."""
    rng = np.random.default_rng(35)
    x = {}
    x["embedding/weight"] = rng.standard_normal((7, 5))
    x["embedding/indices"] = np.array([[0, 3, 3, 6], [1, 3, 0, 0], [6, 6, 6, 2]])
    x["embedding/R"] = rng.standard_normal((3, 4, 5))
    x["layer_norm/x"] = rng.standard_normal((2, 3, 6)) * 3 + 1
    x["layer_norm/weight"] = rng.standard_normal(6)
    x["layer_norm/bias"] = rng.standard_normal(6)
    x["layer_norm/weight2"] = rng.standard_normal((3, 6))
    x["layer_norm/R"] = rng.standard_normal((2, 3, 6))
    x["gelu/x"] = np.concatenate([np.linspace(-9, 9, 61), rng.standard_normal(20) * 2])
    x["gelu/R"] = rng.standard_normal(81)
    x["sdpa/q"] = rng.standard_normal((2, 3, 5, 4))
    x["sdpa/k"] = rng.standard_normal((2, 3, 6, 4))
    x["sdpa/v"] = rng.standard_normal((2, 3, 6, 3))
    mask = rng.random((2, 1, 5, 6)) < 0.6
    mask[..., 0] = True  # every query sees at least one key
    x["sdpa/bool_mask"] = mask
    x["sdpa/float_mask"] = rng.standard_normal((5, 6))
    x["sdpa/kc"] = rng.standard_normal((2, 3, 5, 4))
    x["sdpa/vc"] = rng.standard_normal((2, 3, 5, 3))
    x["sdpa/R"] = rng.standard_normal((2, 3, 5, 3))
    x["mha/x"] = rng.standard_normal((2, 5, 8))
    x["mha/memory"] = rng.standard_normal((2, 6, 8))
    x["mha/padding"] = np.array([[False] * 6, [False] * 4 + [True] * 2])
    x["mha/R"] = rng.standard_normal((2, 5, 8))
    x["cross_entropy/logits"] = rng.standard_normal((6, 5)) * 2
    x["cross_entropy/target"] = np.array([0, 4, -100, 2, 2, -100])
    x["cross_entropy/logits3"] = rng.standard_normal((2, 5, 3))
    x["cross_entropy/target3"] = np.array([[1, -100, 4], [0, 0, 3]])
    x["cross_entropy/R"] = rng.standard_normal(6)
    x["tied/tokens"] = np.array([[1, 2, 3, 1], [0, 6, 6, 5]])
    x["tied/targets"] = np.array([[2, 3, 1, 0], [6, 6, 5, -100]])
    return x


def record(dtype: str) -> dict:
    """torch's results for every case in ``dtype`` (and the MHA weights torch
    drew, under ``mha/state/...``)."""
    import torch
    import torch.nn.functional as F

    x = inputs()
    dt = getattr(torch, dtype)
    out = {}

    def t(name, grad=True):
        return torch.tensor(x[name], dtype=dt, requires_grad=grad)

    def put(prefix, **arrays):
        for name, value in arrays.items():
            out[f"{prefix}/{name}"] = value.detach().numpy()

    w = t("embedding/weight")
    y = F.embedding(torch.tensor(x["embedding/indices"]), w)
    (y * t("embedding/R", False)).sum().backward()
    put("embedding", out=y, grad_weight=w.grad)

    for case, wname in (("layer_norm", "layer_norm/weight"), ("layer_norm2", "layer_norm/weight2")):
        xx, ww = t("layer_norm/x"), t(wname)
        bb = t("layer_norm/bias") if case == "layer_norm" else None
        y = F.layer_norm(xx, tuple(ww.shape), ww, bb, 1e-5)
        (y * t("layer_norm/R", False)).sum().backward()
        put(case, out=y, grad_x=xx.grad, grad_weight=ww.grad, **({"grad_bias": bb.grad} if bb is not None else {}))

    for approximate in ("none", "tanh"):
        xx = t("gelu/x")
        y = F.gelu(xx, approximate=approximate)
        (y * t("gelu/R", False)).sum().backward()
        put(f"gelu_{approximate}", out=y, grad_x=xx.grad)

    sdpa_cases = {
        "plain": {},
        "bool_mask": {"attn_mask": torch.tensor(x["sdpa/bool_mask"])},
        "float_mask": {"attn_mask": torch.tensor(x["sdpa/float_mask"], dtype=dt)},
        "scale": {"scale": 0.3},
        "causal": {"is_causal": True},
    }
    for case, kwargs in sdpa_cases.items():
        causal = case == "causal"
        q, k, v = t("sdpa/q"), t("sdpa/kc" if causal else "sdpa/k"), t("sdpa/vc" if causal else "sdpa/v")
        y = F.scaled_dot_product_attention(q, k, v, **kwargs)
        (y * t("sdpa/R", False)).sum().backward()
        put(f"sdpa_{case}", out=y, grad_q=q.grad, grad_k=k.grad, grad_v=v.grad)

    torch.manual_seed(35)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True, dtype=dt)
    with torch.no_grad():  # non-zero biases, so that their gradients are tested
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    for name, value in mha.state_dict().items():
        out[f"mha/state/{name}"] = value.numpy().copy()
    causal_mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)  # True = masked, as torch
    for case in ("self_causal", "cross_padding", "seq_first"):
        mha.zero_grad()
        xx, memory = t("mha/x"), t("mha/memory")
        if case == "self_causal":
            y, weights = mha(xx, xx, xx, attn_mask=causal_mask, need_weights=True)
            (y * t("mha/R", False)).sum().backward()
            put(case, weights=weights)
        elif case == "cross_padding":
            y, weights = mha(xx, memory, memory, key_padding_mask=torch.tensor(x["mha/padding"]),
                             need_weights=True, average_attn_weights=False)
            (y * t("mha/R", False)).sum().backward()
            put(case, weights=weights, grad_memory=memory.grad)
        else:
            seq_first = torch.nn.MultiheadAttention(8, 2, batch_first=False, dtype=dt)
            seq_first.load_state_dict(mha.state_dict())
            y, _ = seq_first(xx.transpose(0, 1), xx.transpose(0, 1), xx.transpose(0, 1), need_weights=False)
            y = y.transpose(0, 1)
            (y * t("mha/R", False)).sum().backward()
            mha = seq_first
        put(f"mha_{case}", out=y, grad_x=xx.grad,
            **{f"grad/{name}": p.grad for name, p in mha.named_parameters()})

    for reduction in ("mean", "sum", "none"):
        z = t("cross_entropy/logits")
        loss = F.cross_entropy(z, torch.tensor(x["cross_entropy/target"]), reduction=reduction)
        (loss * t("cross_entropy/R", False) if reduction == "none" else loss).sum().backward()
        put(f"cross_entropy_{reduction}", out=loss, grad=z.grad)
    z = t("cross_entropy/logits3")
    loss = F.cross_entropy(z, torch.tensor(x["cross_entropy/target3"]))
    loss.backward()
    put("cross_entropy_kdim", out=loss, grad=z.grad)

    embedding = torch.nn.Embedding(7, 4, dtype=dt)
    head = torch.nn.Linear(4, 7, bias=False, dtype=dt)
    head.weight = embedding.weight  # tied
    logits = head(embedding(torch.tensor(x["tied/tokens"])) * 2.0)
    loss = F.cross_entropy(logits.reshape(-1, 7), torch.tensor(x["tied/targets"]).reshape(-1))
    out["tied/weight"] = embedding.weight.detach().numpy().copy()
    loss.backward()
    put("tied", loss=loss, grad_weight=embedding.weight.grad)
    return {f"{key}/{dtype}": value for key, value in out.items()}


def main():
    import torch

    arrays = {f"input/{key}": value for key, value in inputs().items()}
    for dtype in DTYPES:
        arrays.update(record(dtype))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, torch_version=np.array(torch.__version__), **arrays)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, torch {torch.__version__})")


if __name__ == "__main__":
    main()
