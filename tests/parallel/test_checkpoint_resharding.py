"""Distributed checkpoints (minidist.distributed.checkpoint) that reshard.

A small float64 GPT's parameters are laid out as DTensors on a dp2 x tp2 mesh
in tensor-parallel layouts (up-projections and embeddings Shard(0) on tp,
down-projections Shard(1), LayerNorms and down-projection biases Replicate;
all Replicate on dp), with Adam's moments in the same layouts and a step
count; saved on 4 ranks. Loaded into tp4, dp4 with every parameter Shard(0)
(FSDP2's layout), 2x2 HSDP ``(Replicate(), Shard(0))``, one process and an
uneven Shard(0) (position embeddings of 5 rows on 4 ranks: 2, 2, 1, 0), every
local piece equals the saved full arrays' box BIT FOR BIT, and each rank
reads exactly the saved chunks its box overlaps (the chunk lists and byte
counts are computed here from the layouts, independently of the loader).

Also: the save wrote each replicated box once (the files' sizes add up to
the state's bytes once); async_save writes the same files as save, and an
update right after it returns does not reach them; each error (a target of
another shape, a missing or truncated shard file, another model's keys, a
dtype mismatch) names the key and the file and changes no array; a rank
that fails while writing ends every rank naming it and leaves the previous
checkpoint as it was; a pipeline's stages save and load under the whole
model's names at another depth.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
import minidist.distributed.checkpoint as dcp
from minidist import nn, optim
from minidist.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from minidist.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh
from minidist.models.gpt import GPT, GPTConfig

CONFIG = GPTConfig(vocab_size=12, block_size=5, n_layer=2, n_head=2, n_embd=8)
STEP = 3


def full_state():
    """The saved values: the GPT's weights (seed 0) and made-up Adam moments."""
    model = GPT(CONFIG, rng=0, dtype=np.float64)
    rng = np.random.default_rng(1)
    weights = {k: v for k, v in model.state_dict().items()}
    moments = {name: (rng.normal(size=p.shape), np.abs(rng.normal(size=p.shape)))
               for name, p in model.named_parameters()}
    return weights, moments


def tp_layout(name, ndim):
    """Megatron's layouts on the tp mesh dim."""
    if name.endswith("c_attn.weight") or name.endswith("c_fc.weight") or \
            name.endswith("c_attn.bias") or name.endswith("c_fc.bias") or name.endswith("wte.weight") \
            or name.endswith("wpe.weight") or name == "lm_head.weight":
        return Shard(0)
    if name.endswith("c_proj.weight"):
        return Shard(1)
    return Replicate()


LAYOUTS = {
    "dp2xtp2": ((2, 2), ("dp", "tp"), lambda name, ndim: (Replicate(), tp_layout(name, ndim))),
    "tp4": ((4,), ("tp",), lambda name, ndim: (tp_layout(name, ndim),)),
    "fsdp4": ((4,), ("dp",), lambda name, ndim: (Shard(0),)),
    "hsdp2x2": ((2, 2), ("replicate", "shard"), lambda name, ndim: (Replicate(), Shard(0))),
}


def build(layout, values=None, seed=5):
    """A GPT whose parameters are DTensors of ``layout`` (values: the full
    arrays; None: weights drawn from another generator and no optimizer state yet), with an Adam."""
    shape, names, rule = LAYOUTS[layout]
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    model = GPT(CONFIG, rng=seed, dtype=np.float64)
    weights = values[0] if values else model.state_dict()
    for name, param in list(model.named_parameters()):
        owner, attr = _owner(model, name)
        dt = nn.Parameter(distribute_tensor(weights[name], mesh, rule(name, param.ndim)))
        setattr(owner, attr, dt)
        if name == "transformer.wte.weight":
            model.lm_head.weight = dt          # tied, as GPT ties them
    optimizer = optim.Adam(model.parameters(), lr=1e-3)
    if values:
        for index, param, _ in optimizer._indexed_params():
            name = next(n for n, p in model.named_parameters() if p is param)
            m, v = (_box(a, param) for a in values[1][name])
            optimizer.state[index] = {"step": STEP, "exp_avg": m, "exp_avg_sq": v}
    return model, optimizer, mesh


def _owner(model, name):
    *path, attr = name.split(".")
    owner = model
    for part in path:
        owner = getattr(owner, part)
    return owner, attr


def _box(full, param):
    sizes, offsets = param._spec.local_shape_and_offset()
    return full[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))].copy()


def expected_reads(full_shape, saved_boxes, box):
    """The saved chunks (offsets, sizes) that overlap ``box``, by brute force
    over element indices."""
    wanted = np.zeros(full_shape, bool)
    wanted[tuple(slice(o, o + s) for o, s in zip(*box))] = True
    return sorted((o, s) for o, s in saved_boxes
                  if wanted[tuple(slice(a, a + b) for a, b in zip(o, s))].any())


def _rows_met(offsets, sizes, box):
    """How many of a chunk's rows (dim 0) fall in ``box``: what a load reads of it."""
    if not sizes:
        return 1
    return min(offsets[0] + sizes[0], box[0][0] + box[1][0]) - max(offsets[0], box[0][0])


def _state_of(model, optimizer):
    """Every local array of the model and optimizer (to compare before/after)."""
    arrays = {k: p.data.copy() for k, p in model.named_parameters()}
    for index, entries in optimizer.state.items():
        for key, value in entries.items():
            arrays[f"state.{index}.{key}"] = np.array(value, copy=True)
    return arrays


def _check_bits(model, optimizer, values):
    """Every local piece against the full arrays' box: bit for bit."""
    weights, moments = values
    bad = []
    names = {id(p): n for n, p in model.named_parameters()}
    for name, param in model.named_parameters():
        if not np.array_equal(param.data, _box(weights[name], param)):
            bad.append(name)
    for index, param, group in optimizer._indexed_params():
        state = optimizer.state[index]
        name = names[id(param)]
        if state["step"] != STEP or group["lr"] != 1e-3:
            bad.append(f"{name} step/lr")
        for which, key in enumerate(("exp_avg", "exp_avg_sq")):
            if not np.array_equal(state[key], _box(moments[name][which], param)):
                bad.append(f"{name}.{key}")
    return bad


def _save_tp(path):
    values = full_state()
    model, optimizer, _ = build("dp2xtp2", values)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    metadata = dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
    chunks = {k: [(c["offsets"], c["sizes"], c["rank"]) for c in t["chunks"]]
              for k, t in metadata.tensors.items()}
    whole = sum(int(np.prod(t["shape"])) * 8 for t in metadata.tensors.values())
    tensor_bytes = sum(c["nbytes"] for t in metadata.tensors.values() for c in t["chunks"])
    return chunks, (metadata.total_bytes(), tensor_bytes, whole)


def _load_into(layout, path):
    values = full_state()
    model, optimizer, mesh = build(layout)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    report = dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    boxes = {k: report.box[k] for k in report.box}
    reads = {k: sorted((tuple(c[2]), tuple(c[3])) for c in v) for k, v in report.reads.items()}
    tensor_bytes = sum(c[4] for v in report.reads.values() for c in v)
    return {"bad": _check_bits(model, optimizer, values), "boxes": boxes, "reads": reads,
            "bytes_read": tensor_bytes, "text": report.text(),
            "wpe": report.text("model.transformer.wpe.weight")}


def _attempt(model, optimizer, state_dict, path):
    """Load, expecting an error: its text, and whether any array changed."""
    before = _state_of(model, optimizer)
    try:
        dcp.load(state_dict, checkpoint_id=path)
    except Exception as error:  # noqa: BLE001 - the text is the result
        message = str(error)
    else:
        message = None
    after = _state_of(model, optimizer)
    changed = [k for k in before if not np.array_equal(before[k], after[k])]
    return message, changed


def _copy_damaged(path, name, damage):
    """Rank 0 copies the checkpoint to ``name`` and damages it; all wait."""
    import shutil
    target = os.path.join(os.path.dirname(path), name)
    if dist.get_rank() == 0:
        shutil.copytree(path, target)
        damage(target)
    dist.barrier()
    return target


def _truncate(folder):
    shard = os.path.join(folder, "__1_0.distcp")
    with open(shard, "r+b") as file:
        file.truncate(os.path.getsize(shard) // 2)


def _errors(path):
    """Each damaged or foreign checkpoint: (message, arrays changed)."""
    out = {}
    model, optimizer, _ = build("fsdp4")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    whole = {"model": model_sd, "optim": optim_sd}
    missing = _copy_damaged(path, "missing", lambda f: os.remove(os.path.join(f, "__1_0.distcp")))
    out["missing_file"] = _attempt(model, optimizer, whole, missing)
    out["truncated"] = _attempt(model, optimizer, whole, _copy_damaged(path, "cut", _truncate))
    wide = GPTConfig(vocab_size=13, block_size=5, n_layer=2, n_head=2, n_embd=8)
    other = GPT(wide, rng=0, dtype=np.float64)
    out["shape"] = _attempt(other, optim.Adam(other.parameters()),
                            {"model": other.state_dict()}, path)
    single = GPT(CONFIG, rng=0, dtype=np.float32)
    out["dtype"] = _attempt(single, optim.Adam(single.parameters()),
                            {"model": single.state_dict()}, path)
    odd = {"model": dict(model_sd), "optim": optim_sd}      # one rank's target is wrong
    if dist.get_rank() == 2:
        odd["model"]["transformer.wpe.weight"] = np.zeros((5, 9))
    out["one_rank"] = _attempt(model, optimizer, odd, path)
    mlp = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2)).double()
    foreign = os.path.join(os.path.dirname(path), "mlp")
    dcp.save({"model": mlp.state_dict()}, checkpoint_id=foreign)
    out["keys"] = _attempt(model, optimizer, whole, foreign)
    return out


def _async(path):
    """async_save, then an update at once: the files are save's."""
    values = full_state()
    model, optimizer, _ = build("dp2xtp2", values)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    target = os.path.join(os.path.dirname(path), "async")
    import sys
    import threading
    save_module = sys.modules["minidist.distributed.checkpoint.save"]
    real, changed = save_module.write_bytes, threading.Event()

    def after_the_change(file, payload, key):   # the thread writes only once the state changed
        changed.wait(60)
        real(file, payload, key)

    save_module.write_bytes = after_the_change
    try:
        future = dcp.async_save({"model": model_sd, "optim": optim_sd}, checkpoint_id=target)
        for sd in (model_sd, *optim_sd["state"].values()):      # the state changed at once
            for value in sd.values():
                if hasattr(value, "_spec"):
                    value.data += 1.0
        changed.set()
        future.result(timeout=120)
    finally:
        save_module.write_bytes = real
    dist.barrier()
    return future.done(), _file_bytes(target) == _file_bytes(path)


def _file_bytes(folder):
    return {name: open(os.path.join(folder, name), "rb").read() for name in os.listdir(folder)}


def _failing_save(path):
    """Rank 1 fails half-way through its file: every rank names it, the old
    checkpoint stays whole, nothing is left beside it."""
    import sys
    save_module = sys.modules["minidist.distributed.checkpoint.save"]  # the name is the function
    before = _file_bytes(path)
    values = full_state()
    model, optimizer, _ = build("dp2xtp2", values)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    real = save_module.write_bytes

    def disk_full(file, payload, key):
        file.write(bytes(memoryview(payload).cast("B"))[:7])
        raise OSError(28, "No space left on device")

    if dist.get_rank() == 1:
        save_module.write_bytes = disk_full
    try:
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
        message = None
    except RuntimeError as error:
        message = str(error)
    finally:
        save_module.write_bytes = real
    dist.barrier()
    if dist.get_rank() == 1:
        save_module.write_bytes = disk_full
    try:
        future = dcp.async_save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
        future.result(timeout=120)
        async_message = None
    except RuntimeError as error:
        async_message = str(error)
    finally:
        save_module.write_bytes = real        # after the thread has written
    dist.barrier()
    partial = distribute_tensor(np.ones((4, 2)), init_device_mesh("cpu", (4,)),
                                [minidist.distributed.tensor.Partial()])
    try:
        dcp.save({"p": partial}, checkpoint_id=os.path.join(os.path.dirname(path), "partial"))
        refused = None
    except RuntimeError as error:
        refused = str(error)
    left = sorted(os.listdir(os.path.dirname(path)))
    return message, _file_bytes(path) == before, left, refused, async_message


def _pipeline_values():
    rng = np.random.default_rng(3)
    model = _mlp()
    weights = {k: rng.normal(size=tuple(p.shape)) for k, p in model.named_parameters()}
    momenta = {k: rng.normal(size=tuple(p.shape)) for k, p in model.named_parameters()}
    return weights, momenta


def _mlp():
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                         nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def _stage(model, stages, index):
    """Stage ``index`` of ``stages``: the Linear layers cut evenly (a slice of a
    Sequential keeps the whole model's names: "4.weight")."""
    cuts = np.linspace(0, 4, stages + 1).astype(int) * 2
    cuts[-1] = len(model)
    return model[cuts[index]:cuts[index + 1]]


def _pipeline_save(path):
    weights, momenta = _pipeline_values()
    model = _mlp()
    model.load_state_dict(weights)
    stage = _stage(model, dist.get_world_size(), dist.get_rank())
    optimizer = optim.SGD(stage.parameters(), lr=0.05, momentum=0.9)
    for index, param, _ in optimizer._indexed_params():
        name = next(n for n, p in stage.named_parameters() if p is param)
        optimizer.state[index] = {"momentum_buffer": momenta[name].copy()}
    model_sd, optim_sd = get_state_dict(stage, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
    return sorted(model_sd)


def _pipeline_load(path, stages=None, index=0):
    """Load into stage ``index`` of ``stages`` (None: the launch's world) and
    compare with the saved values: the names wrong, or None."""
    weights, momenta = _pipeline_values()
    model = _mlp()
    stages = dist.get_world_size() if stages is None else stages
    index = dist.get_rank() if dist.is_initialized() else index
    stage = _stage(model, stages, index)
    optimizer = optim.SGD(stage.parameters(), lr=0.5, momentum=0.5)
    model_sd, optim_sd = get_state_dict(stage, optimizer)
    report = dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
    set_state_dict(stage, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    bad = [n for n, p in stage.named_parameters() if not np.array_equal(p.data, weights[n])]
    for i, param, group in optimizer._indexed_params():
        name = next(n for n, p in stage.named_parameters() if p is param)
        if not np.array_equal(optimizer.state[i]["momentum_buffer"], momenta[name]) or \
                group["lr"] != 0.05 or group["momentum"] != 0.9:
            bad.append(f"{name} state")
    return sorted(model_sd), bad, sorted(report.reads)


def _module_state_dict():
    """Module.state_dict gives DTensors of the parameters' layouts (copies);
    load_state_dict takes the same layout or a whole array, and refuses
    another layout naming dcp.load; full_state_dict gathers whole."""
    from minidist.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    values = full_state()
    model, _, _ = build("fsdp4", values)
    state = model.state_dict()
    weight = state["transformer.h.0.mlp.c_fc.weight"]
    layout = (type(weight).__name__, weight.placements, weight.shape, weight.to_local().shape)
    copied = weight.data is not model.transformer.h[0].mlp.c_fc.weight.data
    fresh, _, _ = build("fsdp4")
    fresh.load_state_dict(state)
    same = all(np.array_equal(p.data, q.data) for p, q in
               zip(model.parameters(), fresh.parameters()))
    whole, _, _ = build("tp4")
    whole.load_state_dict(values[0])                        # whole arrays: cut to the box
    cut = all(np.array_equal(p.data, _box(values[0][n], p)) for n, p in whole.named_parameters())
    try:
        whole.load_state_dict(state)
        refused = None
    except RuntimeError as error:
        refused = str(error)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    gathered = all(np.array_equal(full[k], values[0][k]) for k in values[0])
    return layout, copied, same, cut, refused, gathered


def _round_trips(path):
    saved, sizes = _save_tp(path)
    results = {"saved": saved, "bytes": sizes}
    for layout in ("tp4", "fsdp4", "hsdp2x2"):
        results[layout] = _load_into(layout, path)
    results["errors"] = _errors(path)
    results["async"] = _async(path)
    results["failing"] = _failing_save(path)
    results["module"] = _module_state_dict()
    results["pipeline"] = _pipeline_load(os.path.join(os.path.dirname(path), "..", "pipe"))
    return results


@pytest.mark.timeout(400)
@pytest.mark.parametrize("transport", ["pipe", "shm"])
def test_tp_checkpoint_loads_into_every_layout_bit_for_bit(tmp_path, transport):
    (tmp_path / "four").mkdir()
    path = str(tmp_path / "four" / "ckpt")
    pipe = str(tmp_path / "pipe")
    held = minidist.launch(_pipeline_save, world_size=2, transport=transport, args=(pipe,),
                           timeout=120)
    assert held == [["0.bias", "0.weight", "2.bias", "2.weight"],
                    ["4.bias", "4.weight", "6.bias", "6.weight"]]     # the whole model's names
    ranks = minidist.launch(_round_trips, world_size=4, transport=transport, args=(path,),
                            timeout=240)
    saved = ranks[0]["saved"]
    weights, _ = full_state()
    # a replicated box is written once: by the lowest rank holding it
    ln = saved["model.transformer.h.0.ln_1.weight"]
    assert ln == [((0,), (8,), 0)]
    c_fc = saved["model.transformer.h.0.mlp.c_fc.weight"]
    assert c_fc == [((0, 0), (16, 8), 0), ((16, 0), (16, 8), 1)]
    proj = saved["optim.state.transformer.h.1.mlp.c_proj.weight.exp_avg"]
    assert proj == [((0, 0), (8, 16), 0), ((0, 16), (8, 16), 1)]
    # the files hold every key's bytes exactly once: the chunks tile each tensor
    total, tensor_bytes, whole_bytes = ranks[0]["bytes"]
    assert tensor_bytes == whole_bytes
    files = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
                if f.endswith(".distcp"))
    assert files == total
    assert sorted(os.listdir(path)) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    for layout in ("tp4", "fsdp4", "hsdp2x2"):
        for rank, result in enumerate(ranks):
            assert result[layout]["bad"] == [], (layout, rank, result[layout]["bad"])
            expected_bytes = 0
            for key, box in result[layout]["boxes"].items():
                saved_boxes = [(o, s) for o, s, _ in saved[key]]
                shape = weights[key.split(".", 1)[1]].shape if key.startswith("model.") else \
                    weights[key.split(".", 2)[2].rsplit(".", 1)[0]].shape
                want = expected_reads(shape, saved_boxes, box) if np.prod(box[1]) else []
                assert result[layout]["reads"].get(key, []) == want, (layout, rank, key)
                expected_bytes += sum(_rows_met(o, s, box) * int(np.prod(s[1:])) * 8
                                      for o, s in want)
            assert result[layout]["bytes_read"] == expected_bytes, (layout, rank)
    # the uneven cut: wpe (5 rows) on 4 ranks is 2, 2, 1, 0 rows; tp2 saved 3 + 2 rows
    wpe = [r["fsdp4"]["reads"].get("model.transformer.wpe.weight", []) for r in ranks]
    assert wpe == [[((0, 0), (3, 8))], [((0, 0), (3, 8)), ((3, 0), (2, 8))],
                   [((3, 0), (2, 8))], []]
    assert [r["fsdp4"]["wpe"] for r in ranks] == [
        "rank 0 read 1 of 2 chunks, 128 B of 320 B of model.transformer.wpe.weight",
        "rank 1 read 2 of 2 chunks, 128 B of 320 B of model.transformer.wpe.weight",
        "rank 2 read 1 of 2 chunks, 64 B of 320 B of model.transformer.wpe.weight",
        "rank 3 read 0 of 2 chunks, 0 B of 320 B of model.transformer.wpe.weight"]
    # tp4 on a tp2 save: every rank reads one chunk of each tp-sharded tensor, half of it
    c_attn = [r["tp4"]["reads"]["model.transformer.h.0.attn.c_attn.weight"] for r in ranks]
    assert c_attn == [[((0, 0), (12, 8))]] * 2 + [[((12, 0), (12, 8))]] * 2
    # the errors: each names the key and the file, and changes nothing
    for rank, result in enumerate(ranks):
        errors = result["errors"]
        for case, (message, changed) in errors.items():
            assert message is not None and changed == [], (case, rank, message, changed)
        assert "__1_0.distcp is missing" in errors["missing_file"][0]
        assert "'model.transformer.h.0.attn.c_attn.weight'" in errors["missing_file"][0]
        assert "__1_0.distcp is truncated" in errors["truncated"][0]
        assert "size mismatch for 'model.transformer.wte.weight'" in errors["shape"][0]
        assert "saved with shape (12, 8)" in errors["shape"][0] and path in errors["shape"][0]
        assert "dtype mismatch for 'model.transformer.wpe.weight'" in errors["dtype"][0]
        assert "saved as float64, the target is float32" in errors["dtype"][0]
        assert "failed on rank(s) [2]:\n  rank 2: ValueError" in errors["one_rank"][0]
        assert "size mismatch for 'model.transformer.wpe.weight'" in errors["one_rank"][0]
        assert "missing key 'model.transformer.wte.weight'" in errors["keys"][0]
        assert "'model.0.weight'" in errors["keys"][0]          # what the other model had
        assert result["async"] == (True, True)
        message, unchanged, left, refused, async_message = result["failing"]
        assert message.startswith("save to ") and "failed on rank(s) [1]" in message
        assert "No space left on device" in message and "__1_0.distcp" in message
        assert unchanged
        assert left == ["async", "ckpt", "cut", "missing", "mlp"]
        assert "Partial DTensor" in refused and "reduce it first" in refused
        assert "failed on rank" in async_message and "rank 1" in async_message
        assert "No space left on device" in async_message

    # Module.state_dict and load_state_dict on DTensor parameters
    for result in ranks:
        layout, copied, same, cut, refused, gathered = result["module"]
        assert layout == ("DTensor", (Shard(0),), (32, 8), (8, 8)) and copied and same and cut
        assert ("'transformer.h.0.mlp.c_fc.weight' is laid out (Shard(dim=0),) on DeviceMesh((dp=4), "
                "'cpu', mesh=[0, 1, 2, 3]) in the state dict but (Shard(dim=0),) on "
                "DeviceMesh((tp=4), 'cpu', mesh=[0, 1, 2, 3]) in this model") in refused
        assert "'transformer.h.0.attn.c_proj.weight' is laid out" in refused
        assert "minidist.distributed.checkpoint, which reshards" in refused and gathered
    # a pipeline of 2 stages loaded on 4: each stage holds and reads one Linear's keys
    for rank, result in enumerate(ranks):
        keys, bad, read = result["pipeline"]
        assert keys == [f"{2 * rank}.bias", f"{2 * rank}.weight"] and bad == []
        assert read == sorted(f"{part}.{2 * rank}.{what}" for part in ("model",)
                              for what in ("bias", "weight")) + sorted(
            f"optim.state.{2 * rank}.{what}.momentum_buffer" for what in ("bias", "weight"))
    # ... and on 1 stage, in one process: the whole model
    keys, bad, _ = _pipeline_load(pipe, stages=1)
    assert bad == [] and len(keys) == 8

def test_one_process_loads_the_sharded_checkpoint_whole(tmp_path):
    path = str(tmp_path / "ckpt")
    minidist.launch(_save_tp, world_size=4, transport="pipe", args=(path,), timeout=240)
    values = full_state()
    model = GPT(CONFIG, rng=7, dtype=np.float64)
    optimizer = optim.Adam(model.parameters(), lr=0.5)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    report = dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    assert report.chunks_read == report.chunks_saved and report.bytes_read == report.bytes_saved
    for name, param in model.named_parameters():
        assert np.array_equal(param.data, values[0][name]), name
    for index, param, group in optimizer._indexed_params():
        name = next(n for n, p in model.named_parameters() if p is param)
        state = optimizer.state[index]
        assert state["step"] == STEP and group["lr"] == 1e-3 and group["betas"] == (0.9, 0.999)
        assert np.array_equal(state["exp_avg"], values[1][name][0])
        assert np.array_equal(state["exp_avg_sq"], values[1][name][1])



def test_one_process_save_replace_and_refusals(tmp_path):
    """Outside a launch: a save, a second save over it (the old folder replaced
    whole, nothing left beside), object leaves put back where the target had
    them, allow_partial_load, and the folders a save refuses to replace."""
    path = str(tmp_path / "ckpt")
    model = GPT(CONFIG, rng=0, dtype=np.float64)
    extra = {"step": 5, "betas": (0.9, 0.99), "note": {"text": "first"}}
    dcp.save({"model": model.state_dict(), "extra": extra}, checkpoint_id=path)
    extra["note"]["text"] = "second"
    weights = model.state_dict()
    weights["transformer.wpe.weight"] += 1.0
    dcp.save({"model": weights, "extra": extra}, checkpoint_id=path)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
    fresh = GPT(CONFIG, rng=9, dtype=np.float64)
    target = {"model": fresh.state_dict(), "extra": {"step": 0, "betas": None, "note": {"text": ""}},
              "not_saved": np.zeros(3)}
    before = target["not_saved"]
    report = dcp.load(target, checkpoint_id=path, allow_partial_load=True)
    fresh.load_state_dict(target["model"])
    assert all(np.array_equal(fresh.state_dict()[k], weights[k]) for k in weights)
    assert target["extra"] == {"step": 5, "betas": (0.9, 0.99), "note": {"text": "second"}}
    assert target["not_saved"] is before and report.unexpected == []
    with pytest.raises(ValueError, match="missing key 'not_saved'"):
        dcp.load(target, checkpoint_id=path)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"holds files that are not a checkpoint's \(\['todo.txt'\]\)"):
        dcp.save({"x": np.ones(2)}, checkpoint_id=str(tmp_path / "notes"))
    assert (tmp_path / "notes" / "todo.txt").read_text() == "mine"
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        dcp.load({"x": np.ones(2)}, checkpoint_id=str(tmp_path / "nowhere"))
