"""FSDP2 (``fully_shard``) trains as one process does, sends what the formula says,
and fails cleanly.

One launch per world size (2 and 4) and transport (pipe and shm) runs every
training case in the workers, float64; each rank trains on an equal share of
each global batch, and every rank must end with one process's weights on the
whole batch, rtol 1e-9:

* an MLP whose dims are uneven on 4 ranks (5 x 7, 7 x 5, 3 x 5, 1-D biases;
  torch.chunk leaves the 4th rank of a 5-row weight nothing), each layer a
  unit and the Sequential the root, with SGD + momentum and AdamW, with
  reshard_after_forward True and False;
* the GPT with its tied embedding (a unit per block, the root holding wte,
  wpe, ln_f and lm_head, whose weight is wte's: one DTensor, still tied);
* explicit prefetching (set_modules_to_forward_prefetch and _backward_prefetch)
  trains the same;
* set_requires_gradient_sync(False): 2 micro-batches, no reduce_scatter
  until the last, then one step, equal to one process's accumulation;
* HSDP on a 2 x 2 mesh (world 4): layouts (Replicate(), Shard(0));
* MixedPrecisionPolicy(float16, float32) (world 2): the module computes with
  float16 weights, the masters and gradients stay float32, equal to one
  process doing the same casts;
* what the layouts are: DTensorParameters, local shapes torch.chunk's, the
  state dict's entries DTensors; unshard() registers the whole weights,
  reshard() the DTensors again, unshard(async_op=True) gives a handle to
  wait on; load_state_dict takes the DTensors back, or a whole model's
  arrays (each rank cuts its piece); the memory ledger measures the shards and
  one unit's unsharded weights exactly;
* refusals, each in one line: a tie torn by sharding one of its layers,
  an int reshard_after_forward, bfloat16, a ModuleList.

The trace (shm, world 2 and 4, ring algorithms): one all_gather per unit per
forward, one more per non-root unit per backward when resharded, one
reduce_scatter per unit per backward, bytes equal to the formula; HSDP's
all_reduce once per unit; the prefetched all_gathers start inside the
previous unit's forward (from the second step on, or from the first with
set_modules_to_forward_prefetch).

A rank whose parameter shape differs (its unit's all_gather then differs),
or that raises before a unit's all_gather while the other waits in it,
fails every rank, naming it (not a timeout), pipe and shm, leaving no
shared memory.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import Tensor, memory, nn, optim, trace
from minidist.distributed.device_mesh import init_device_mesh
from minidist.distributed.tensor import DTensor, Replicate, Shard
from minidist.models.gpt import GPT, GPTConfig
from minidist.parallel.data import FullyShardedDataParallel
from minidist.parallel.placements import FSDPModule, MixedPrecisionPolicy, fully_shard
from minidist.runtime.errors import WorkerError
from minidist.runtime.segments import PREFIX

CONFIG = GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8)
STEPS = 3
PER_RANK = 2


# --------------------------------------------------------------------------- models and data

def _mlp(dtype=np.float64):
    nn.init.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 5), nn.Tanh(),
                         nn.Linear(5, 3)).to(dtype)


def _gpt():
    return GPT(CONFIG, rng=0).double()


def _shard_mlp(model, **kwargs):
    for index in (0, 2, 4):
        fully_shard(model[index], **kwargs)
    return fully_shard(model, **kwargs)


def _shard_gpt(model, **kwargs):
    for block in model.transformer.h:
        fully_shard(block, **kwargs)
    return fully_shard(model, **kwargs)


def _mlp_batches(total, steps=STEPS, seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((total, 5)), rng.integers(0, 3, total)) for _ in range(steps)]


def _gpt_batches(total, steps=STEPS):
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, CONFIG.vocab_size, (steps, total, CONFIG.block_size + 1))
    return [(t[:, :-1], t[:, 1:]) for t in tokens]


def _mlp_loss(out, y):
    return nn.CrossEntropyLoss()(out, y)


def _gpt_loss(logits, y):
    return nn.CrossEntropyLoss()(logits.reshape(-1, CONFIG.vocab_size), y.reshape(-1))


def _optimizer(name, parameters):
    if name == "sgd":
        return optim.SGD(parameters, lr=0.1, momentum=0.9)
    return optim.AdamW(parameters, lr=0.01, weight_decay=0.1)


def _train(model, batches, loss_fn, opt_name, share=slice(None), micro=1):
    """STEPS steps; ``micro`` micro-batches per step (no gradient sync but the last)."""
    optimizer = _optimizer(opt_name, model.parameters())
    for x, y in batches:
        x, y = x[share], y[share]
        pieces = np.array_split(np.arange(len(x)), micro)
        optimizer.zero_grad()
        for index, rows in enumerate(pieces):
            if isinstance(model, FSDPModule):
                model.set_requires_gradient_sync(index == micro - 1)
            loss_fn(model(Tensor(x[rows]) if x.dtype.kind == "f" else x[rows]),
                    y[rows]).backward()
        optimizer.step()
    return model


def _full(model) -> list:
    """Every parameter's whole array (a collective for the DTensors)."""
    return [p.full_tensor().numpy() if isinstance(p, DTensor) else p.data.copy()
            for p in model.parameters()]


def _share(rank):
    return slice(rank * PER_RANK, (rank + 1) * PER_RANK)


# --------------------------------------------------------------------------- the cases

CASES = [("mlp", "sgd", True), ("mlp", "sgd", False), ("mlp", "adamw", True),
         ("mlp", "adamw", False), ("gpt", "sgd", True), ("gpt", "adamw", False)]


def _case(kind, opt_name, reshard, world_size, share, **kwargs):
    make, shard, batches, loss_fn = (
        (_mlp, _shard_mlp, _mlp_batches, _mlp_loss) if kind == "mlp"
        else (_gpt, _shard_gpt, _gpt_batches, _gpt_loss))
    model = shard(make(), reshard_after_forward=reshard, **kwargs)
    _train(model, batches(world_size * PER_RANK), loss_fn, opt_name, share)
    return model


def _layouts(world_size):
    """What fully_shard made: DTensor parameters, torch.chunk's local shapes,
    the tie kept, the state dict's DTensors."""
    model = _shard_gpt(_gpt())
    params = list(model.parameters())
    wte = model.transformer.wte.weight
    return dict(
        all_dtensors=all(isinstance(p, DTensor) and isinstance(p, nn.Parameter) for p in params),
        placements=sorted({repr(p.placements) for p in params}),
        local_shapes=[tuple(p.data.shape) for p in params],
        global_shapes=[tuple(p.shape) for p in params],
        tied=model.lm_head.weight is wte,
        root_holds_tie=any(fp.sharded is wte for fp in model._state.group.params),
        classes=[type(model).__name__, type(model.transformer.h[0]).__name__],
        is_fsdp=[isinstance(model, FSDPModule), isinstance(model.transformer.h[0], FSDPModule)],
        state_dict=sorted({type(v).__name__ for v in model.state_dict().values()}),
        count=len(params), unshard=_unshard_reshard(model), loads=_loads())


def _loads():
    """load_state_dict takes the DTensors state_dict() gave, or a whole model's
    arrays (each rank cuts its piece): either way the weights come back."""
    model = _shard_mlp(_mlp())
    saved = model.state_dict()
    _train(model, _mlp_batches(dist.get_world_size() * PER_RANK, steps=1), _mlp_loss, "sgd",
           _share(dist.get_rank()))
    model.load_state_dict(saved)
    back = all(np.array_equal(p.data, saved[name].data) for name, p in model.named_parameters())
    whole = _mlp()
    for p in whole.parameters():
        p.data = p.data + 1.0
    model.load_state_dict(whole.state_dict())
    cut = all(np.array_equal(a, b) for a, b in zip(_full(model), _full(whole)))
    return back, cut


def _unshard_reshard(model):
    """unshard() registers the whole weights as plain Parameters, reshard() the
    DTensors again; unshard(async_op=True) returns a handle to wait on."""
    block = model.transformer.h[0]
    shapes = [tuple(p.shape) for p in block.parameters()]     # the DTensors' global shapes
    block.unshard()
    whole = [(type(p).__name__, tuple(p.data.shape)) for p in block.parameters()]
    block.reshard()
    handle = model.transformer.h[1].unshard(async_op=True)
    handle.wait()
    waited = all(type(p) is nn.Parameter for p in model.transformer.h[1].parameters())
    model.transformer.h[1].reshard()
    return dict(whole=whole, waited=waited, shapes=shapes,
                back=all(isinstance(p, DTensor) for p in model.parameters()))


def _accumulation(world_size, share):
    """2 micro-batches per step, one sync: the shards get no gradient in between."""
    model = _shard_mlp(_mlp())
    optimizer = _optimizer("sgd", model.parameters())
    between = []
    for x, y in _mlp_batches(world_size * PER_RANK * 2):
        x, y = x[share2(share)], y[share2(share)]
        optimizer.zero_grad()
        for index, rows in enumerate(np.array_split(np.arange(len(x)), 2)):
            model.set_requires_gradient_sync(index == 1)
            _mlp_loss(model(Tensor(x[rows])), y[rows]).backward()
            if index == 0:
                between.append(all(p.grad is None for p in model.parameters()))
        optimizer.step()
    return _full(model), between


def share2(share):
    return slice(share.start * 2, share.stop * 2)


def _ledger(world_size):
    """The ledger's parameters are the shards. As the second Linear starts an
    eval forward (after fully_shard's pre-hook), what the ledger measures is
    the other units' shards and this unit's unsharded weights exactly (the
    first Linear's are freed, the root holds none, the first step prefetches
    nothing; ``model.parameters()`` gives the unsharded ones then, as
    torch's); after the forward, the shards alone."""
    model = _shard_mlp(_mlp())
    optimizer = _optimizer("adamw", model.parameters())
    ledger = model.track_memory(memory.Ledger(model, optimizer))
    shards = sum(p.data.nbytes for p in model.parameters())
    mine = sum(p.data.nbytes for p in model[2].parameters())
    seen = []

    def probe(module, args):
        held = ledger.measure()
        seen.append(held["parameters"] + held["buffers"])

    model[2].register_forward_pre_hook(probe)
    with minidist.no_grad():
        model(Tensor(np.ones((2, 5))))
    held = ledger.measure()
    flat = FullyShardedDataParallel(_mlp(), sharding_strategy="FULL_SHARD")
    return dict(params=ledger.measure()["parameters"], shards=shards, seen=seen,
                unit=shards - mine + (7 * 5 + 5) * 8, after=held["parameters"] + held["buffers"],
                fsdp1=memory.Ledger(flat).measure()["parameters"])


def _mixed(world_size, share):
    """float16 compute, float32 reduce and masters (the reference emulates it)."""
    policy = MixedPrecisionPolicy(param_dtype=np.float16, reduce_dtype=np.float32)
    model = _shard_mlp(_mlp(np.float32), mp_policy=policy)
    seen = []
    model[2].register_forward_pre_hook(lambda m, a: seen.append(
        (str(m.weight.data.dtype), str(a[0].data.dtype))))
    _train(model, _mlp_batches(world_size * PER_RANK), _mlp_loss, "sgd", share)
    cast = _shard_mlp(_mlp(np.float32), mp_policy=MixedPrecisionPolicy(
        param_dtype=np.float16, output_dtype=np.float32))
    with minidist.no_grad():
        output = str(cast(Tensor(np.ones((2, 5), np.float32))).data.dtype)
    return dict(weights=_full(model), seen=seen[0], output=output,
                masters=sorted({str(p.data.dtype) for p in model.parameters()}))


def _refusals():
    out = {}
    gpt = _gpt()
    fully_shard(gpt.transformer.wte)
    for key, action in [("torn", lambda: fully_shard(gpt)),
                        ("int", lambda: fully_shard(nn.Linear(2, 2), reshard_after_forward=2)),
                        ("bf16", lambda: MixedPrecisionPolicy(param_dtype="bfloat16")),
                        ("list", lambda: fully_shard(nn.ModuleList([nn.Linear(2, 2)]))),
                        ("twice", lambda: fully_shard(gpt.transformer.wte))]:
        try:
            action()
            out[key] = None
        except (ValueError, TypeError, NotImplementedError) as error:
            out[key] = str(error)
    return out


def _worker():
    rank, world_size = dist.get_rank(), dist.get_world_size()
    share = _share(rank)
    out = {"cases": {}}
    for kind, opt_name, reshard in CASES:
        model = _case(kind, opt_name, reshard, world_size, share)
        out["cases"][(kind, opt_name, reshard)] = _full(model)
        if kind == "gpt":
            out.setdefault("tied_after", []).append(
                model.lm_head.weight is model.transformer.wte.weight)
    model = _shard_mlp(_mlp())
    model[0].set_modules_to_forward_prefetch([model[2]])
    model[2].set_modules_to_forward_prefetch([model[4]])
    model[4].set_modules_to_backward_prefetch([model[2]])
    model[2].set_modules_to_backward_prefetch([model[0]])
    _train(model, _mlp_batches(world_size * PER_RANK), _mlp_loss, "adamw", share)
    out["explicit_prefetch"] = _full(model)
    out["accumulation"] = _accumulation(world_size, share)
    if world_size == 4:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
        model = _case("mlp", "adamw", True, world_size, share, mesh=mesh)
        out["hsdp"] = _full(model)
        out["hsdp_placements"] = sorted({repr(p.placements) for p in model.parameters()})
    if world_size == 2:
        out["mixed"] = _mixed(world_size, share)
    out["layouts"] = _layouts(world_size)
    out["ledger"] = _ledger(world_size)
    out["refusals"] = _refusals()
    return out


# --------------------------------------------------------------------------- references

def _reference(kind, opt_name, world_size):
    make, batches, loss_fn = ((_mlp, _mlp_batches, _mlp_loss) if kind == "mlp"
                              else (_gpt, _gpt_batches, _gpt_loss))
    return _full(_train(make(), batches(world_size * PER_RANK), loss_fn, opt_name))


def _accumulation_reference(world_size):
    """One process: each rank's share split as the rank splits it, every
    micro-batch's gradient accumulated, divided by the ranks (their mean)."""
    model = _mlp()
    optimizer = _optimizer("sgd", model.parameters())
    for x, y in _mlp_batches(world_size * PER_RANK * 2):
        optimizer.zero_grad()
        for rank in range(world_size):
            xs, ys = x[share2(_share(rank))], y[share2(_share(rank))]
            for rows in np.array_split(np.arange(len(xs)), 2):
                (_mlp_loss(model(Tensor(xs[rows])), ys[rows]) * (1.0 / world_size)).backward()
        optimizer.step()
    return _full(model)


def _mixed_reference(world_size):
    """One process: float16 copies of float32 masters compute each rank's share;
    the gradients, cast to float32, averaged; SGD on the masters."""
    masters = _mlp(np.float32)
    optimizer = _optimizer("sgd", masters.parameters())
    for x, y in _mlp_batches(world_size * PER_RANK):
        total = [np.zeros_like(p.data) for p in masters.parameters()]
        for rank in range(world_size):
            copy = _mlp(np.float16)
            for p, m in zip(copy.parameters(), masters.parameters()):
                p.data = m.data.astype(np.float16)
            xs, ys = x[_share(rank)], y[_share(rank)]
            _mlp_loss(copy(Tensor(xs.astype(np.float16))), ys).backward()
            for t, p in zip(total, copy.parameters()):
                t += p.grad.astype(np.float32)
        optimizer.zero_grad()
        for p, t in zip(masters.parameters(), total):
            p.grad = t / np.float32(world_size)
        optimizer.step()
    return _full(masters)


# --------------------------------------------------------------------------- the tests

def _close(got, expected, label, rtol=1e-9):
    assert len(got) == len(expected), label
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * 1e-3, err_msg=str(label))


@pytest.mark.blas_kernel
@pytest.mark.timeout(600)
@pytest.mark.parametrize("world_size,transport", [(2, "pipe"), (2, "shm"), (4, "pipe"),
                                                  (4, "shm")])
def test_fully_shard_trains_as_one_process(world_size, transport):
    references = {(kind, opt): _reference(kind, opt, world_size)
                  for kind, opt, _ in CASES}
    results = minidist.launch(_worker, world_size=world_size, transport=transport,
                              timeout=480)
    accumulation = _accumulation_reference(world_size)
    hsdp = _reference("mlp", "adamw", world_size) if world_size == 4 else None
    mixed = _mixed_reference(world_size) if world_size == 2 else None
    for rank, out in enumerate(results):
        for (kind, opt, reshard), weights in out["cases"].items():
            _close(weights, references[(kind, opt)], (rank, kind, opt, reshard, transport))
        assert out["tied_after"] == [True, True]
        _close(out["explicit_prefetch"], references[("mlp", "adamw")], (rank, "explicit"))
        weights, between = out["accumulation"]
        _close(weights, accumulation, (rank, "accumulation"))
        assert between == [True] * STEPS        # no reduce_scatter before the last micro-batch
        if hsdp is not None:
            _close(out["hsdp"], hsdp, (rank, "hsdp"))
            assert out["hsdp_placements"] == [repr((Replicate(), Shard(dim=0)))]
        if mixed is not None:
            _close(out["mixed"]["weights"], mixed, (rank, "mixed"), rtol=1e-6)
            assert out["mixed"]["seen"] == ("float16", "float16")
            assert out["mixed"]["masters"] == ["float32"]
            assert out["mixed"]["output"] == "float32"       # output_dtype
        layouts = out["layouts"]
        assert layouts["all_dtensors"] and layouts["tied"] and layouts["root_holds_tie"]
        assert layouts["placements"] == [repr((Shard(dim=0),))]
        assert layouts["classes"] == ["FSDPGPT", "FSDPBlock"] and layouts["is_fsdp"] == [True,
                                                                                          True]
        assert layouts["state_dict"] == ["DTensor"]
        unshard = layouts["unshard"]
        assert unshard["whole"] == [("Parameter", shape) for shape in unshard["shapes"]]
        assert len(unshard["whole"]) == 12
        assert unshard["waited"] and unshard["back"]
        assert layouts["loads"] == (True, True)
        for local, whole in zip(layouts["local_shapes"], layouts["global_shapes"]):
            rows = -(-whole[0] // world_size)
            assert local == (max(0, min(rows, whole[0] - rank * rows)),) + whole[1:]
        ledger = out["ledger"]
        assert ledger["params"] == ledger["shards"]
        assert ledger["seen"] == [ledger["unit"]] and ledger["after"] == ledger["shards"]
        # FSDP1 holds a flat buffer per layer padded to a multiple of N elements.
        assert ledger["fsdp1"] == 8 * sum(-(-n // world_size) for n in (42, 40, 18))
        refusals = out["refusals"]
        assert "lm_head.weight is the Parameter that fully_shard(Embedding) already" in \
            refusals["torn"]
        assert "reshard_after_forward=2" in refusals["int"]
        assert "bfloat16" in refusals["bf16"] and "float16" in refusals["bf16"]
        assert "ModuleList has no forward" in refusals["list"]
        assert "already sharded" in refusals["twice"]
    # FSDP2 stores no padding: the ranks' shards add up to the model, 8 bytes a value.
    assert sum(out["ledger"]["shards"] for out in results) == 8 * (42 + 40 + 18)
    if world_size == 4:   # the 13-row embedding on 4 ranks: 4, 4, 4, 1 rows
        assert results[3]["layouts"]["local_shapes"][0] == (1, CONFIG.n_embd)


# --------------------------------------------------------------------------- the trace

def _traced(reshard, hsdp, explicit):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mesh = (init_device_mesh("cpu", (2, 2)) if hsdp else init_device_mesh("cpu", (world_size,)))
    model = _shard_mlp(_mlp(), mesh=mesh, reshard_after_forward=reshard, algorithm="ring")
    if explicit:   # the first step prefetches too
        model[0].set_modules_to_forward_prefetch([model[2]])
        model[2].set_modules_to_forward_prefetch([model[4]])
    optimizer = _optimizer("sgd", model.parameters())
    for step, (x, y) in enumerate(_mlp_batches(world_size * PER_RANK)):
        with trace.region(f"step {step}"):
            optimizer.zero_grad()
            _mlp_loss(model(Tensor(x[_share(rank)])), y[_share(rank)]).backward()
            optimizer.step()


def _calls(events, rank, collective):
    return [e for e in events if e["rank"] == rank and e["kind"] == "collective"
            and trace.label_info(e["label"]).get("collective") == collective]


def _sent(events, rank, collective):
    return sum(e["bytes"] for e in events if e["rank"] == rank and e["kind"] == "send"
               and trace.label_info(e["label"]).get("call") is not None
               and e["label"].startswith(collective))


# The MLP's units: the three Linears (weight rows, other dims, bias); the root holds none.
UNITS = [((7, 5), (7,)), ((5, 7), (5,)), ((3, 5), (3,))]


def _unit_elements(n):
    """S: each parameter padded to a multiple of n rows, per rank."""
    return [sum(-(-shape[0] // n) * int(np.prod(shape[1:])) for shape in unit) for unit in UNITS]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world_size,reshard,hsdp,explicit", [
    (2, True, False, False), (2, False, False, False), (2, True, False, True),
    (4, True, False, False), (4, True, True, False)])
def test_the_trace_shows_one_gather_per_unit_and_the_formula_bytes(tmp_path, world_size,
                                                                   reshard, hsdp, explicit):
    path = tmp_path / "trace.jsonl"
    minidist.launch(_traced, world_size=world_size, transport="shm",
                    args=(reshard, hsdp, explicit), trace=str(path), timeout=240)
    events = trace.read_jsonl(path).events
    shards = 2 if hsdp else world_size
    replicas = world_size // shards
    sizes = _unit_elements(shards)
    units = len(UNITS)
    gathers_per_step = units * (2 if reshard else 1)    # the root holds no parameter
    for rank in range(world_size):
        gathers = _calls(events, rank, "all_gather")
        reduces = _calls(events, rank, "reduce_scatter")
        assert len(gathers) == STEPS * gathers_per_step, (rank, len(gathers))
        assert len(reduces) == STEPS * units
        assert sorted(e_count(e) for e in reduces) == sorted([shards * s for s in sizes] * STEPS)
        assert _sent(events, rank, "all_gather") == (
            STEPS * (2 if reshard else 1) * sum((shards - 1) * s * 8 for s in sizes))
        assert _sent(events, rank, "reduce_scatter") == STEPS * sum(
            (shards - 1) * s * 8 for s in sizes)
        all_reduces = _calls(events, rank, "all_reduce")
        assert len(all_reduces) == (STEPS * units if replicas > 1 else 0)
        if replicas > 1:   # ring all_reduce on 2 ranks: half of S each way, 2 (R-1)/R S
            assert _sent(events, rank, "all_reduce") == STEPS * sum(
                2 * (replicas - 1) * s * 8 // replicas for s in sizes)
        # Prefetch: from step 2 on (explicit: from step 1), the second and third
        # Linears' all_gathers start inside the previous Linear's forward (they
        # were issued in its pre-hook).
        forwards = sorted((e for e in events if e["rank"] == rank and e["kind"] == "compute"
                           and e["label"].startswith("fully_shard forward Linear")),
                          key=lambda e: e["start"])
        assert len(forwards) == 3 * STEPS
        prefetching = STEPS if explicit else STEPS - 1
        inside = sum(any(f["start"] <= g["start"] < f["end"] for f in forwards[-3 * prefetching:])
                     for g in gathers)
        assert inside == 2 * prefetching, (rank, inside)


def _accumulating(keep):
    """One step of 2 micro-batches, the first without gradient sync; ``keep``:
    the units stay unsharded after the first backward (set_reshard_after_backward)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = _shard_mlp(_mlp(), algorithm="ring")
    x, y = _mlp_batches(world_size * PER_RANK * 2, steps=1)[0]
    x, y = x[share2(_share(rank))], y[share2(_share(rank))]
    for index, rows in enumerate(np.array_split(np.arange(len(x)), 2)):
        model.set_requires_gradient_sync(index == 1)
        model.set_reshard_after_backward(index == 1 or not keep)
        _mlp_loss(model(Tensor(x[rows])), y[rows]).backward()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("keep", [False, True])
def test_accumulating_without_sync_sends_no_reduce_scatter_until_the_last(tmp_path, keep):
    path = tmp_path / "trace.jsonl"
    minidist.launch(_accumulating, world_size=2, transport="shm", args=(keep,),
                    trace=str(path), timeout=60)
    events = trace.read_jsonl(path).events
    units = len(UNITS)
    for rank in range(2):
        # Each micro-batch: a gather per unit in forward and again in backward
        # (resharded after forward); kept after the first backward, the second
        # forward gathers nothing. One reduce_scatter per unit, at the end.
        assert len(_calls(events, rank, "all_gather")) == (3 if keep else 4) * units
        assert len(_calls(events, rank, "reduce_scatter")) == units


def e_count(event):
    return trace.label_info(event["label"])["count"]


# --------------------------------------------------------------------------- failing cleanly

def _odd_shape():
    """Rank 1's first Linear is 5 x 9, the others' 5 x 7: the unit's all_gather differs."""
    rank = dist.get_rank()
    nn.init.manual_seed(0)
    width = 9 if rank == 1 else 7
    model = nn.Sequential(nn.Linear(5, width), nn.Tanh(), nn.Linear(width, 3)).double()
    fully_shard(model)
    model(Tensor(np.ones((2, 5))))


def _raises_before_gathering():
    """Rank 1 raises in the second unit's forward pre-hook (before fully_shard's,
    prepended), while rank 0 waits in that unit's all_gather."""
    model = _shard_mlp(_mlp())
    if dist.get_rank() == 1:
        def fail(module, args):
            raise RuntimeError("rank 1: a pre-hook failed on purpose")
        model[2].register_forward_pre_hook(fail, prepend=True)
    model(Tensor(np.ones((2, 5))))


def _segments():
    return {name for name in os.listdir("/dev/shm") if name.startswith(PREFIX)}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["pipe", "shm"])
@pytest.mark.parametrize("failure,said", [(_odd_shape, "all_gather"),
                                          (_raises_before_gathering, "failed on purpose")])
def test_a_rank_that_fails_in_a_unit_gather_ends_every_rank_naming_it(transport, failure,
                                                                        said):
    before = _segments()
    with pytest.raises(WorkerError) as caught:
        minidist.launch(failure, world_size=2, transport=transport, timeout=60)
    assert caught.value.kind != "timeout", caught.value
    assert caught.value.rank == 1, caught.value
    assert "rank 1" in str(caught.value).splitlines()[0], caught.value
    assert said in str(caught.value)
    deadline = time.monotonic() + 3
    while _segments() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not (_segments() - before)
