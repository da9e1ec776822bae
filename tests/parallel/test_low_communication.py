"""Local SGD and DiLoCo against the algorithms written out on one process.

One launch per world size and transport runs every case; the reference
keeps n copies of the model in one process, steps each on its rank's
batches and averages with NumPy (float64, rtol 1e-12). Checked too: local
SGD with H = 1 and plain SGD is DDP's mean; the outer Nesterov step is
torch's ``SGD(nesterov=True)`` on the same pseudo-gradients; the trace's
bytes per step are DDP's divided by H; the clear errors.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, optim, trace
from minidist.parallel.data.ddp import DistributedDataParallel
from minidist.parallel.data.diloco import DiLoCo
from minidist.parallel.data.local_sgd import LocalSGD

STEPS = 8
RTOL, ATOL = 1e-12, 1e-15


def _model(seed=0):
    nn.init.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4)).double()


def _batch(rank, step, seed=0):
    rng = np.random.default_rng([seed, step, rank])
    return rng.normal(size=(4, 8)), rng.integers(0, 4, size=4)


def _weights(model):
    return [p.data.copy() for p in model.parameters()]


def _inner(kind, params):
    if kind == "sgd":
        return optim.SGD(params, lr=0.1)
    if kind == "momentum":
        return optim.SGD(params, lr=0.1, momentum=0.9)
    return optim.AdamW(params, lr=0.01, weight_decay=0.1)


def _outer(params):
    return optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)


#: name: (method, H, inner optimizer, fragments, fragment_sync_delay, alpha, shared outer)
CASES = {
    "local_sgd H1": ("local_sgd", 1, "momentum", 1, 0, 0.0, False),
    "local_sgd H3": ("local_sgd", 3, "momentum", 1, 0, 0.0, False),
    "diloco H1": ("diloco", 1, "adamw", 1, 0, 0.0, False),
    "diloco H2": ("diloco", 2, "adamw", 1, 0, 0.0, False),
    "diloco H4": ("diloco", 4, "adamw", 1, 0, 0.0, False),
    "streaming H4 F2": ("diloco", 4, "adamw", 2, 0, 0.0, False),
    "streaming H4 F2 shared outer": ("diloco", 4, "adamw", 2, 0, 0.0, True),
    "streaming H8 F2 delay 1 alpha .5": ("diloco", 8, "adamw", 2, 1, 0.5, False),
}


def _fragments(model, count):
    return [model] if count == 1 else [model[0], model[2]]


def _run_case(name):
    method, h, inner_kind, count, delay, alpha, shared = CASES[name]
    rank = dist.get_rank()
    model = _model(seed=1 + rank)           # a different start per rank: the wrapper broadcasts
    inner = _inner(inner_kind, model.parameters())
    outers_seen = []
    if method == "local_sgd":
        wrapper = LocalSGD(model, inner, sync_every=h)
    else:
        fragments = _fragments(model, count)
        outer = _outer(model.parameters()) if shared \
            else [_outer(f.parameters()) for f in fragments]
        wrapper = DiLoCo(fragments if count > 1 else model, inner,
                         outer if shared or count > 1 else outer[0], sync_every=h,
                         fragment_sync_delay=delay, fragment_update_alpha=alpha)
        step = wrapper.outer_step

        def recorded(fragment, delta):
            outers_seen.append((fragment, [d.copy() for d in delta]))
            step(fragment, delta)
        wrapper.outer_step = recorded
    loss_fn = nn.CrossEntropyLoss()
    with wrapper:
        for t in range(STEPS):
            x, y = _batch(rank, t)
            inner.zero_grad()
            loss_fn(model(Tensor(x)), y).backward()
            inner.step()
    return _weights(model), outers_seen


def _ddp_mean():
    """DDP with plain SGD on the same batches: the reference for local SGD, H = 1."""
    rank = dist.get_rank()
    model = _model(seed=1 + rank)
    ddp = DistributedDataParallel(model)
    opt = optim.SGD(ddp.parameters(), lr=0.1)
    for t in range(STEPS):
        x, y = _batch(rank, t)
        opt.zero_grad()
        nn.CrossEntropyLoss()(ddp(Tensor(x)), y).backward()
        opt.step()
    return _weights(model)


def _plain_local_sgd():
    rank = dist.get_rank()
    model = _model(seed=1 + rank)
    opt = optim.SGD(model.parameters(), lr=0.1)
    with LocalSGD(model, opt, 1):
        for t in range(STEPS):
            x, y = _batch(rank, t)
            opt.zero_grad()
            nn.CrossEntropyLoss()(model(Tensor(x)), y).backward()
            opt.step()
    return _weights(model)


#: The byte-counted runs: (label, how); ring all_reduces everywhere.
BYTE_RUNS = [("ddp", None), ("local_sgd 1", 1), ("local_sgd 4", 4), ("diloco 4", 4),
             ("streaming 4 F2", 4)]


def _bytes_run(label, h):
    rank = dist.get_rank()
    model = _model(seed=0)
    if label == "ddp":
        wrapped = DistributedDataParallel(model, algorithm="ring")
        inner = optim.SGD(wrapped.parameters(), lr=0.1)
        context = None
    else:
        wrapped = model
        inner = _inner("adamw", model.parameters())
        if label.startswith("local_sgd"):
            context = LocalSGD(model, inner, h, algorithm="ring")
        else:
            fragments = _fragments(model, 2 if "F2" in label else 1)
            context = DiLoCo(fragments, inner, [_outer(f.parameters()) for f in fragments], h,
                             algorithm="ring")
    with trace.region(f"bytes {label}"):
        with context if context is not None else _nothing():
            for t in range(STEPS):
                x, y = _batch(rank, t)
                inner.zero_grad()
                nn.CrossEntropyLoss()(wrapped(Tensor(x)), y).backward()
                inner.step()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _errors():
    model = _model()
    opt = optim.SGD(model.parameters(), lr=0.1)
    said = {}
    for name, make in {
        "manager": lambda: LocalSGD(object(), model, opt, 2),
        "sync_every": lambda: LocalSGD(model, opt, 0),
        "diloco manager": lambda: DiLoCo(object(), [model], opt, _outer(model.parameters()), 2),
        "multiple": lambda: DiLoCo([model[0], model[2]], opt, _outer(model.parameters()), 3),
        "delay": lambda: DiLoCo([model[0], model[2]], opt, _outer(model.parameters()), 4,
                                fragment_sync_delay=2),
        "alpha": lambda: DiLoCo(model, opt, _outer(model.parameters()), 4,
                                fragment_update_alpha=2.0),
        "outers": lambda: DiLoCo([model[0], model[2]], opt, [_outer(model.parameters())], 4),
    }.items():
        try:
            make()
            said[name] = None
        except (TypeError, ValueError) as error:
            said[name] = str(error)
    return said


def _worker():
    out = {name: _run_case(name) for name in CASES}
    out["ddp mean"] = _ddp_mean()
    out["plain local_sgd"] = _plain_local_sgd()
    for label, h in BYTE_RUNS:
        _bytes_run(label, h)
    out["errors"] = _errors()
    return out


# --------------------------------------------------------------------------- the reference


def _reference(name, n):
    """The algorithm on one process: n copies, the same batches, NumPy's mean."""
    method, h, inner_kind, count, delay, alpha, shared = CASES[name]
    start = _weights(_model(seed=1))        # rank 0's weights, which the wrapper broadcast
    models = [_model() for _ in range(n)]
    for m in models:
        for p, w in zip(m.parameters(), start):
            p.data[...] = w
    inners = [_inner(inner_kind, m.parameters()) for m in models]
    # The outer optimizer acts on one global copy, theta.
    glob = _model()
    for p, w in zip(glob.parameters(), start):
        p.data[...] = w
    g_fragments = _fragments(glob, count)
    outers = [_outer(f.parameters()) for f in g_fragments]
    if shared:
        outers = [_outer(glob.parameters())] * count
    fragment_of = [[id(p) for p in f.parameters()] for f in g_fragments]
    index = {id(p): i for i, p in enumerate(glob.parameters())}
    period = h // count
    local_step, syncs, pending = 0, 0, None
    for t in range(STEPS):
        for r, (m, opt) in enumerate(zip(models, inners)):
            x, y = _batch(r, t)
            opt.zero_grad()
            nn.CrossEntropyLoss()(m(Tensor(x)), y).backward()
            opt.step()
        local_step += 1
        if method == "local_sgd":
            if local_step == h:
                mean = [np.mean([_weights(m)[i] for m in models], axis=0)
                        for i in range(len(start))]
                for m in models:
                    for p, w in zip(m.parameters(), mean):
                        p.data[...] = w
                local_step = 0
            continue
        f = syncs % count
        ids = [index[i] for i in fragment_of[f]]
        gparams = list(glob.parameters())
        if local_step == period - delay:
            pending = [np.mean([gparams[i].data - list(m.parameters())[i].data
                                for m in models], axis=0) for i in ids]
        if local_step == period:
            for p in glob.parameters():
                p.grad = None
            for i, d in zip(ids, pending):
                gparams[i].grad = d.copy()
            outers[f].step()
            for m in models:
                mp = list(m.parameters())
                for i in ids:
                    mp[i].data[...] = gparams[i].data + alpha * (mp[i].data - gparams[i].data)
            local_step, syncs = 0, syncs + 1
    return [_weights(m) for m in models]


def _close(a, b):
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL)


def _sent(events, label, rank=0):
    begin, end = next((e["start"], e["end"]) for e in events if e["rank"] == rank
                      and e["kind"] == "compute" and e["label"] == f"bytes {label}")
    return [e["bytes"] for e in events if e["rank"] == rank and e["kind"] == "send"
            and begin <= e["start"] <= end]


@pytest.mark.blas_kernel
@pytest.mark.timeout(600)
@pytest.mark.parametrize("world_size,transport", [(2, "pipe"), (2, "shm"), (4, "pipe"),
                                                  (4, "shm")])
def test_low_communication(world_size, transport, tmp_path):
    path = tmp_path / "trace.jsonl"
    per_rank = minidist.launch(_worker, world_size=world_size, transport=transport,
                               trace=str(path), timeout=500)
    n = world_size
    # Against the reference, every rank.
    for name in CASES:
        expected = _reference(name, n)
        for rank in range(n):
            _close(per_rank[rank][name][0], expected[rank])
        # One fragment: every rank ends equal after the last sync (where STEPS is a multiple of H).
        if CASES[name][3] == 1 and STEPS % CASES[name][1] == 0:
            for rank in range(1, n):
                _close(per_rank[rank][name][0], per_rank[0][name][0])
    # Local SGD, H = 1, plain SGD: DDP's mean gradient step.
    for rank in range(n):
        _close(per_rank[rank]["plain local_sgd"], per_rank[rank]["ddp mean"])
    # And the replicas drifted between syncs: H = 4 is not H = 1.
    assert not np.allclose(per_rank[0]["diloco H4"][0][0], per_rank[0]["diloco H1"][0][0])

    # The outer step is torch's SGD(nesterov=True) on the same pseudo-gradients.
    torch = pytest.importorskip("torch")
    start = _weights(_model(seed=1))
    for name in ("diloco H1", "diloco H2", "diloco H4"):
        params = [torch.tensor(w.copy()) for w in start]
        sgd = torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)
        seen = per_rank[0][name][1]
        assert len(seen) == STEPS // CASES[name][1]
        for _, delta in seen:
            for p, d in zip(params, delta):
                p.grad = torch.tensor(d)
            sgd.step()
        _close(per_rank[0][name][0], [p.detach().numpy() for p in params])

    # Bytes from the trace: DDP's divided by H.
    events = trace.read_jsonl(path).events
    sent = {label: _sent(events, label) for label, _ in BYTE_RUNS}
    total = {label: sum(b) for label, b in sent.items()}
    values = sum(w.size for w in start)
    ring = 2 * (n - 1) / n * values * 8 * STEPS            # float64, P divisible by n
    assert total["local_sgd 1"] == ring
    assert total["local_sgd 4"] * 4 == total["local_sgd 1"]
    assert total["diloco 4"] == total["local_sgd 4"]
    assert total["streaming 4 F2"] == total["diloco 4"]      # same bytes, in smaller messages
    assert max(sent["streaming 4 F2"]) < max(sent["diloco 4"])
    # DDP: the same gradient all_reduce every step, plus its example count.
    assert ring <= total["ddp"] <= ring + 8 * (n - 1) * STEPS * 2

    errors = per_rank[0]["errors"]
    assert "no torchft Manager" in errors["manager"] and "drop that argument" in errors["manager"]
    assert "no torchft Manager" in errors["diloco manager"]
    assert "int >= 1" in errors["sync_every"]
    assert "multiple of F" in errors["multiple"]
    assert "fragment_sync_delay" in errors["delay"]
    assert "fragment_update_alpha" in errors["alpha"]
    assert "one per fragment" in errors["outers"]
