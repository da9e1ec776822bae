"""The placement pieces together, as a user combines them, against one process
on the whole batch (float64):

* **TP + checkpoint**: a GPT laid out by ``parallelize_module`` on the tp dim
  of a dp2 x tp2 mesh (torch's plan: ColwiseParallel / RowwiseParallel on the
  MLP and the attention's c_proj, PackedColwiseParallel(3) on the fused
  c_attn; the dp replicas' gradients averaged by hand), 2 AdamW steps, its
  ``get_state_dict`` saved by ``dcp.save``; loaded into the GPT on tp4, into
  one process (the plain GPT) and into FSDP2 on dp4: the gathered weights bit
  for bit the saved ones, and a third step equal to the unbroken run's
  (rtol 1e-9); a one-process state dict put into the tp4 GPT by
  ``load_state_dict``; the plan with a vocabulary-parallel wte and lm_head
  (tied, ``loss_parallel``) on tp4, saved and loaded in one process;
* **FSDP2 + checkpoint**: the same saved under ``fully_shard`` on dp4, loaded
  on dp2 (2 ranks), HSDP 2x2 and one process;
* a plain array that differs between ranks (a piece taken for the whole, or
  replicas drifted apart) is refused by ``dcp.save``, naming the ranks and the
  key, and nothing is written;
* **clip_grad_norm_** on the DTensor TP styles', FSDP2's and HSDP's
  parameters: the total norm one process's (rtol 1e-12; a replicated DTensor,
  as torch's) and the clipped weights after 2 SGD
  steps (rtol 1e-10); the per-rank norm of FSDP2's local shards is another
  number on each rank; FSDP2 over TP on a 2-D mesh is refused (said below);
* **gradient accumulation**: FSDP2's ``set_requires_gradient_sync(False)``
  over 2 micro-batches then a synced one equals one batch of the three (no
  gradient reaches the shards before the synced one); the TP styles with
  plain accumulation over 2 micro-batches equal one batch.

One launch per world size (4, and 2 for the dp2 load) and transport.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
import minidist.distributed.checkpoint as dcp
from minidist import optim
from minidist.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from minidist.distributed.tensor import Replicate
from minidist.models.gpt import GPT, GPTConfig
from minidist.nn import functional as F
from minidist.nn.utils import clip_grad_norm_, get_total_norm

CONFIG = GPTConfig(vocab_size=12, block_size=8, n_layer=2, n_head=4, n_embd=16)
STEP_RTOL, NORM_RTOL, WEIGHT_RTOL, ATOL = 1e-9, 1e-12, 1e-10, 1e-13
BATCH, LR, DECAY = 4, 0.01, 0.1
MAX_NORM, SGD_LR = 0.05, 0.1
TRANSPORTS = ["pipe", "shm"]


# ----------------------------------------------------------------- shared pieces


def _gpt(seed=0):
    return GPT(CONFIG, rng=seed).to(np.float64)


def _batch(step, batch=BATCH):
    rng = np.random.default_rng(40 + step)
    return (rng.integers(0, CONFIG.vocab_size, (batch, 8)),
            rng.integers(0, CONFIG.vocab_size, (batch, 8)))


def _loss(model, idx, targets):
    logits = model(idx)
    return F.cross_entropy(logits.reshape(-1, CONFIG.vocab_size), targets.reshape(-1))


def _adamw(model):
    return optim.AdamW(model.parameters(), lr=LR, weight_decay=DECAY)


def _whole(model) -> dict:
    """The model's state as whole arrays (a collective: DTensors gathered)."""
    out = {}
    for key, value in model.state_dict().items():
        if hasattr(value, "full_tensor"):
            value = value.full_tensor().data
        out[key] = np.array(value)
    return out


def _step(model, optimizer, step, rows, sync=None, loss_of=None):
    """One training step on ``rows`` of the step's batch; ``sync``: averages
    the gradients over the data-parallel replicas (the TP runs' dp dim)."""
    idx, targets = _batch(step)
    optimizer.zero_grad()
    loss = (loss_of or _loss)(model, idx[rows], targets[rows])
    loss.backward()
    if sync is not None:
        sync(model)
    optimizer.step()
    return float(np.asarray(loss.data))


def _dp_average(group, size):
    def sync(model):
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, group=group)
                p.grad /= size
    return sync


def _tp_plan(model, tp_mesh):
    from minidist.parallel import (
        ColwiseParallel,
        PackedColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    plan = {}
    for part, style in (("attn.c_attn", PackedColwiseParallel(3)),
                        ("attn.c_proj", RowwiseParallel()),
                        ("mlp.c_fc", ColwiseParallel()), ("mlp.c_proj", RowwiseParallel())):
        plan[f"transformer.h.*.{part}"] = style
    parallelize_module(model, tp_mesh, plan)
    for block in model.transformer.h:
        block.attn.n_head //= tp_mesh.size()
    return model


def _vocab_plan(model, tp_mesh):
    """The whole plan torch users write: also the vocabulary-parallel wte and
    lm_head (tied again after), the logits left Shard(-1) for loss_parallel."""
    from minidist.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    _tp_plan(model, tp_mesh)
    parallelize_module(model, tp_mesh, {"transformer.wte": RowwiseParallel(),
                                        "lm_head": ColwiseParallel(use_local_output=False)})
    model.lm_head.weight = model.transformer.wte.weight
    return model


def _parallel_loss(model, idx, targets):
    from minidist.parallel import loss_parallel
    with loss_parallel():
        return F.cross_entropy(model(idx).reshape(-1, CONFIG.vocab_size), targets.reshape(-1))


def _fsdp(model, mesh):
    from minidist.parallel.placements import fully_shard
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _load(model, optimizer, folder):
    """torch's resharding load: a state dict of this layout, filled, put back."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder)
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)


def _save(model, optimizer, folder):
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder)


def _loaded_step(model, optimizer, folder, rows, sync=None):
    _load(model, optimizer, folder)
    loaded = _whole(model)
    loss = _step(model, optimizer, 2, rows, sync)
    return dict(loaded=loaded, loss=loss, after=_whole(model))


def _rows(world_rank, parts):
    share = BATCH // parts
    return slice(world_rank * share, (world_rank + 1) * share)


# ----------------------------------------------------------------- the workers


def _tp_mesh():
    from minidist.distributed.tensor import init_device_mesh
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp = mesh.get_coordinate()[0]
    return mesh, _rows(dp, 2), _dp_average(mesh.get_group("dp"), 2)


def _worker4(tp_folder, fsdp_folder, vocab_folder):
    from minidist.distributed.tensor import init_device_mesh
    rank = dist.get_rank()
    out = {}

    # 1. TP on dp2 x tp2: 2 steps, save, an unbroken third step
    mesh, rows, sync = _tp_mesh()
    model = _tp_plan(_gpt(), mesh["tp"])
    optimizer = _adamw(model)
    losses = [_step(model, optimizer, s, rows, sync) for s in range(2)]
    out["tp_saved"] = _whole(model)
    _save(model, optimizer, tp_folder)
    losses.append(_step(model, optimizer, 2, rows, sync))
    out["tp_losses"], out["tp_after"] = losses, _whole(model)

    # ... loaded on tp4 (every rank the whole batch) and on FSDP2's dp4
    flat = init_device_mesh("cpu", (4,))
    model = _tp_plan(_gpt(seed=1), flat)
    out["tp_to_tp4"] = _loaded_step(model, _adamw(model), tp_folder, slice(None))
    model = _fsdp(_gpt(seed=1), flat)
    out["tp_to_fsdp4"] = _loaded_step(model, _adamw(model), tp_folder, _rows(rank, 4))
    model = _tp_plan(_gpt(seed=1), flat)        # a one-process state dict, by load_state_dict
    model.load_state_dict(_gpt().state_dict())
    out["tp_from_plain"] = _whole(model)

    # ... and the vocabulary-parallel plan on tp4 (loss_parallel), saved for one process
    model = _vocab_plan(_gpt(), flat)
    optimizer = _adamw(model)
    for s in range(2):
        _step(model, optimizer, s, slice(None), loss_of=_parallel_loss)
    out["vocab_saved"] = _whole(model)
    _save(model, optimizer, vocab_folder)

    # 2. FSDP2 on dp4: 2 steps, save, an unbroken third step; loaded on HSDP 2x2
    model = _fsdp(_gpt(), flat)
    optimizer = _adamw(model)
    losses = [_step(model, optimizer, s, _rows(rank, 4)) for s in range(2)]
    out["fsdp_saved"] = _whole(model)
    _save(model, optimizer, fsdp_folder)
    losses.append(_step(model, optimizer, 2, _rows(rank, 4)))
    out["fsdp_losses"], out["fsdp_after"] = losses, _whole(model)
    hsdp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    model = _fsdp(_gpt(seed=1), hsdp)
    out["fsdp_to_hsdp"] = _loaded_step(model, _adamw(model), fsdp_folder, _rows(rank, 4))

    # a plain array that differs between ranks is no copy: the save refuses it
    import os
    drifted = os.path.join(os.path.dirname(tp_folder), "drifted")
    try:
        dcp.save({"w": np.full((2, 3), float(rank // 2)), "same": np.ones(3)},
                 checkpoint_id=drifted)
        out["drifted"] = "saved"
    except ValueError as error:     # on every rank, the same words
        out["drifted"] = str(error)
    out["drifted_left"] = os.path.exists(drifted)

    # 3. clip_grad_norm_ under the TP styles and under FSDP2
    model = _tp_plan(_gpt(), mesh["tp"])
    out["clip_tp"] = _clipped(model, rows, sync)
    model = _fsdp(_gpt(), flat)
    out["clip_fsdp"] = _clipped(model, _rows(rank, 4), None, local_norm=True)
    model = _fsdp(_gpt(), hsdp)
    out["clip_hsdp"] = _clipped(model, _rows(rank, 4), None)
    out["fsdp_over_tp"] = _fsdp_over_tp(mesh)

    # 4. accumulation: FSDP2 without sync for 2 micro-batches, then a synced one;
    # the TP styles accumulating 2 micro-batches
    model = _fsdp(_gpt(), flat)
    out["accum_fsdp"] = _accumulated(model, 3, _rows(rank, 4), fsdp=True)
    model = _tp_plan(_gpt(), mesh["tp"])
    out["accum_tp"] = _accumulated(model, 2, rows, sync=sync)
    return out


def _worker2(fsdp_folder):
    from minidist.distributed.tensor import init_device_mesh
    model = _fsdp(_gpt(seed=1), init_device_mesh("cpu", (2,)))
    return {"fsdp_to_dp2": _loaded_step(model, _adamw(model), fsdp_folder,
                                        _rows(dist.get_rank(), 2))}


def _clipped(model, rows, sync, local_norm=False):
    optimizer = optim.SGD(model.parameters(), lr=SGD_LR)
    norms, local = [], []
    for step in range(2):
        idx, targets = _batch(step)
        optimizer.zero_grad()
        _loss(model, idx[rows], targets[rows]).backward()
        if sync is not None:
            sync(model)
        if local_norm:   # the one-process function on this rank's shards alone
            local.append(float(get_total_norm([p.grad for p in model.parameters()]).data))
        total = clip_grad_norm_(model.parameters(), MAX_NORM)
        norms.append(total.full_tensor().item())     # torch's: a replicated DTensor
        optimizer.step()
    return dict(norms=norms, local=local, after=_whole(model), item=total.item(),
                kind=(type(total).__name__, str(total.placements)))


def _fsdp_over_tp(mesh):
    """FSDP2 on the dp dim over a model laid out on the tp dim (the whole plan;
    the MLPs' DTensor styles only): what it says."""
    from minidist.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    said = []
    mlp_only = parallelize_module(_gpt(), mesh["tp"], {
        "transformer.h.*.mlp.c_fc": ColwiseParallel(),
        "transformer.h.*.mlp.c_proj": RowwiseParallel()})
    for model in (_tp_plan(_gpt(), mesh["tp"]), mlp_only):
        try:
            _fsdp(model, mesh["dp"])
            said.append("accepted")
        except Exception as error:   # the message is the result
            said.append(f"{type(error).__name__}: {error}")
    return said


def _accumulated(model, micro, rows, fsdp=False, sync=None):
    optimizer = optim.SGD(model.parameters(), lr=SGD_LR)
    idx, targets = _batch(10, BATCH * micro)
    untouched = None
    for k in range(micro):
        last = k == micro - 1
        if fsdp:
            model.set_requires_gradient_sync(last)
        part = slice(k * BATCH, (k + 1) * BATCH)
        loss = _loss(model, idx[part][rows], targets[part][rows])
        (loss * (1.0 / micro)).backward()
        if fsdp and k == micro - 2:
            untouched = all(p.grad is None for p in model.parameters())
    if sync is not None:
        sync(model)
    optimizer.step()
    return dict(after=_whole(model), untouched=untouched)


# ----------------------------------------------------------------- one process


def _reference_adamw():
    model = _gpt()
    optimizer = _adamw(model)
    saved, losses = None, []
    for step in range(3):
        if step == 2:
            saved = _whole(model)
        losses.append(_step(model, optimizer, step, slice(None)))
    return dict(saved=saved, losses=losses, after=_whole(model))


def _reference_clip():
    model = _gpt()
    optimizer = optim.SGD(model.parameters(), lr=SGD_LR)
    norms = []
    for step in range(2):
        idx, targets = _batch(step)
        optimizer.zero_grad()
        _loss(model, idx, targets).backward()
        norms.append(float(clip_grad_norm_(model.parameters(), MAX_NORM).data))
        optimizer.step()
    return dict(norms=norms, after=_whole(model))


def _reference_accumulated(micro):
    model = _gpt()
    optimizer = optim.SGD(model.parameters(), lr=SGD_LR)
    idx, targets = _batch(10, BATCH * micro)
    _loss(model, idx, targets).backward()
    optimizer.step()
    return _whole(model)


def _one_process_load(folder):
    """The plain GPT in this process loads a checkpoint saved by many."""
    model = _gpt(seed=1)
    return _loaded_step(model, _adamw(model), folder, slice(None))


# ----------------------------------------------------------------- the runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    outcome = {}
    for transport in TRANSPORTS:
        folder = tmp_path_factory.mktemp(f"together_{transport}")
        tp, fsdp, vocab = str(folder / "tp"), str(folder / "fsdp"), str(folder / "vocab")
        four = minidist.launch(_worker4, world_size=4, transport=transport,
                               args=(tp, fsdp, vocab), timeout=240)
        two = minidist.launch(_worker2, world_size=2, transport=transport, args=(fsdp,),
                              timeout=240)
        outcome[transport] = dict(four=four, two=two, tp_to_one=_one_process_load(tp),
                                  fsdp_to_one=_one_process_load(fsdp),
                                  vocab_to_one=_one_process_load(vocab))
    return outcome


@pytest.fixture(scope="module")
def reference():
    return dict(adamw=_reference_adamw(), clip=_reference_clip(),
                accum3=_reference_accumulated(3), accum2=_reference_accumulated(2))


def _close(got: dict, want: dict, rtol):
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=rtol, atol=ATOL, err_msg=key)


def _same_bits(got: dict, want: dict):
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key].dtype == want[key].dtype and np.array_equal(got[key], want[key]), key


ALL = pytest.mark.parametrize("transport", TRANSPORTS)
MARKS = [pytest.mark.blas_kernel, pytest.mark.slow, pytest.mark.timeout(1500)]


def _marked(test):
    for mark in MARKS:
        test = mark(test)
    return ALL(test)


@_marked
def test_tp_training_saves_and_reloads_on_tp4_one_process_and_fsdp2(runs, reference, transport):
    run, ref = runs[transport], reference["adamw"]
    four = run["four"]
    saved = four[0]["tp_saved"]
    _close(saved, ref["saved"], STEP_RTOL)
    for r in four:
        _same_bits(r["tp_saved"], saved)                 # every rank gathers the same
        _close(r["tp_after"], ref["after"], STEP_RTOL)
    halves = np.mean([four[0]["tp_losses"], four[2]["tp_losses"]], axis=0)   # dp 0 and 1
    np.testing.assert_allclose(halves, ref["losses"], rtol=STEP_RTOL)
    unbroken = four[0]["tp_after"]
    loaded = ([r["tp_to_tp4"] for r in four] + [r["tp_to_fsdp4"] for r in four]
              + [run["tp_to_one"]])
    for result in loaded:
        _same_bits(result["loaded"], saved)
        _close(result["after"], unbroken, STEP_RTOL)
    assert run["tp_to_one"]["loss"] == pytest.approx(ref["losses"][2], rel=STEP_RTOL)
    plain = _whole(_gpt())
    for r in four:
        _same_bits(r["tp_from_plain"], plain)


@_marked
def test_the_vocabulary_parallel_plan_saves_for_one_process(runs, reference, transport):
    run, ref = runs[transport], reference["adamw"]
    saved = run["four"][0]["vocab_saved"]
    _close(saved, ref["saved"], STEP_RTOL)
    for r in run["four"]:
        _same_bits(r["vocab_saved"], saved)
    _same_bits(run["vocab_to_one"]["loaded"], saved)
    assert run["vocab_to_one"]["loss"] == pytest.approx(ref["losses"][2], rel=STEP_RTOL)


@_marked
def test_fsdp2_training_saves_and_reloads_on_dp2_hsdp_and_one_process(runs, reference, transport):
    run, ref = runs[transport], reference["adamw"]
    four = run["four"]
    saved = four[0]["fsdp_saved"]
    _close(saved, ref["saved"], STEP_RTOL)
    unbroken = four[0]["fsdp_after"]
    _close(unbroken, ref["after"], STEP_RTOL)
    np.testing.assert_allclose(np.mean([r["fsdp_losses"] for r in four], axis=0),
                               ref["losses"], rtol=STEP_RTOL)
    loaded = ([r["fsdp_to_hsdp"] for r in four] + [r["fsdp_to_dp2"] for r in run["two"]]
              + [run["fsdp_to_one"]])
    for result in loaded:
        _same_bits(result["loaded"], saved)
        _close(result["after"], unbroken, STEP_RTOL)


@_marked
def test_clip_grad_norm_on_the_tp_styles_and_fsdp2_is_one_process_norm(runs, reference,
                                                                       transport):
    ref = reference["clip"]
    assert all(n > MAX_NORM for n in ref["norms"])      # every step clips
    four = runs[transport]["four"]
    for r in four:
        for case in ("clip_tp", "clip_fsdp", "clip_hsdp"):
            np.testing.assert_allclose(r[case]["norms"], ref["norms"], rtol=NORM_RTOL)
            assert r[case]["item"] == r[case]["norms"][-1]
            mesh_dims = 2 if case == "clip_hsdp" else 1
            assert r[case]["kind"] == ("DTensor", str((Replicate(),) * mesh_dims))
            _close(r[case]["after"], ref["after"], WEIGHT_RTOL)
    # each rank's own shards give another number, and another on each rank
    local = [r["clip_fsdp"]["local"][0] for r in four]
    assert all(abs(n - ref["norms"][0]) > 1e-3 * ref["norms"][0] for n in local)
    assert len({round(n, 12) for n in local}) == 4


@_marked
def test_fsdp2_over_tp_on_a_2d_mesh_is_refused_with_the_way_out(runs, transport):
    packed, styles = runs[transport]["four"][0]["fsdp_over_tp"]
    for said in (packed, styles):
        assert said.startswith("NotImplementedError"), said
        assert "FSDP2 over tensor parallelism" in said and "all_reduce over mesh['dp']" in said
    assert "attn.c_attn.weight is already a split layer's piece" in packed
    assert "mlp.c_fc.weight is already a DTensor laid out (Shard(dim=0),)" in styles


@_marked
def test_accumulation_under_fsdp2_and_the_tp_styles_is_one_batch(runs, reference, transport):
    for r in runs[transport]["four"]:
        assert r["accum_fsdp"]["untouched"] is True     # no gradient before the synced one
        _close(r["accum_fsdp"]["after"], reference["accum3"], WEIGHT_RTOL)
        _close(r["accum_tp"]["after"], reference["accum2"], WEIGHT_RTOL)


@_marked
def test_a_plain_array_that_differs_between_ranks_is_not_saved_as_a_copy(runs, transport):
    for r in runs[transport]["four"]:
        said = r["drifted"]
        assert "ranks 0 and 2 hold different values for the same box of 'w'" in said, said
        assert "make it a DTensor of its layout" in said
        assert r["drifted_left"] is False
