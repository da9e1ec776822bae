"""torch.distributed.pipelining's names on minidist compute what torch computes.

* examples/ported_pipelining.py, a torch pipelining script ported line by
  line, is turned back into torch's (every ``# torch:`` line put back) and
  run by torch on one process (world size 1, every stage on rank 0: torch
  runs all its schedules so); the minidist script runs under ``minidist
  run`` on 1 and on 2 processes. For every schedule both have (GPipe, 1F1B,
  interleaved 1F1B, and each zero-bubble one minidist has), every
  micro-batch's loss, the merged output and every gradient of two SGD steps,
  and the weights at the end, equal one process's arithmetic (the gradient
  of the micro-batches' mean loss: torch's ``scale_grads``) to rtol 1e-9,
  and torch's. Without torch the minidist runs are still held to the
  arithmetic.
* In one launch of 2 ranks: ``scale_grads=False`` sums, ``eval()`` and a
  schedule without ``loss_fn`` run the forwards only, gradients accumulate
  over steps when not zeroed and are divided with the rest (torch's
  arithmetic), :func:`pipeline` cuts a Sequential or a chained module at
  ``SplitPoint``s, and what differs from torch is refused with a line
  saying what to write.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, optim
from minidist.parallel.pipeline import SCHEDULES
from minidist.parallel.pipeline.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
    SplitPoint,
    pipe_split,
    pipeline,
)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "ported_pipelining.py"
RTOL, ATOL = 1e-9, 1e-13
#: the script's schedule names -> minidist's schedule they run
MINIDIST_NAME = {"gpipe": "gpipe", "1f1b": "1f1b", "interleaved_1f1b": "interleaved_1f1b",
                 "interleaved_zero_bubble": "zb_h1", "zbv": "zbv", "dualpipev": "dualpipev"}
NAMES = [name for name, ours in MINIDIST_NAME.items() if ours in SCHEDULES]
MARK = re.compile(r"^(\s*)(.*?)\s+# torch: (.*)$")


def to_torch(text: str) -> str:
    """The torch script a ported one came from: each ``code  # torch: line``
    becomes ``line``, at the same indentation."""
    lines = []
    for line in text.splitlines():
        found = MARK.match(line)
        lines.append(found.group(1) + found.group(3) if found else line)
    return "\n".join(lines) + "\n"


def _records(folder: Path, name: str) -> dict:
    merged = {}
    for path in sorted(folder.glob(f"{name}.*.npz")):
        with np.load(path) as saved:
            merged.update({key: saved[key] for key in saved.files})
    return merged


def _run(command, folder, env=None, timeout=300):
    folder.mkdir()
    done = subprocess.run([*command, *NAMES, "--record", str(folder)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return {name: _records(folder, name) for name in NAMES}


@pytest.fixture(scope="module")
def minidist_runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ported")
    return {world: _run([sys.executable, "-m", "minidist.cli", "run", "-n", str(world),
                         str(SCRIPT)], folder / f"minidist{world}") for world in (1, 2)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory):
    pytest.importorskip("torch.distributed.pipelining")
    folder = tmp_path_factory.mktemp("torch")
    script = folder / "train_in_torch.py"
    script.write_text(to_torch(SCRIPT.read_text()))
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    env.pop("PYTHONPATH", None)   # torch's script must not see minidist
    return _run([sys.executable, str(script)], folder / "records", env)


def _arithmetic() -> dict:
    """One process: the script's model, weights and data; per step, each
    micro-batch's loss backpropagated as it is, the gradients divided by the
    4 micro-batches, SGD with momentum."""
    rng = np.random.default_rng(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                          nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    model.load_state_dict({key: rng.normal(size=tuple(p.shape)) * 0.5
                           for key, p in model.named_parameters()})
    x, y = rng.normal(size=(13, 6)), rng.integers(0, 3, 13)
    optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    record = {}
    for step in range(2):
        optimizer.zero_grad()
        losses, outputs = [], []
        for xs, ys in zip(np.array_split(x, 4), np.array_split(y, 4)):
            output = model(Tensor(xs))
            loss = nn.CrossEntropyLoss()(output, ys)
            loss.backward()
            losses.append(loss.item())
            outputs.append(output.data)
        record[f"{step}.losses"] = np.array(losses)
        record[f"{step}.output"] = np.concatenate(outputs)
        for key, p in model.named_parameters():
            p.grad /= 4
            record[f"{step}.grad.{key}"] = p.grad.copy()
        optimizer.step()
    for key, p in model.named_parameters():
        record[f"weight.{key}"] = p.data.copy()
    return record


def _assert_same(got: dict, expected: dict, who: str) -> None:
    assert sorted(got) == sorted(expected), who
    for key, value in expected.items():
        np.testing.assert_allclose(got[key], value, rtol=RTOL, atol=ATOL, err_msg=f"{who} {key}")


@pytest.mark.timeout(600)
def test_the_ported_script_on_minidist_is_one_process_arithmetic(minidist_runs):
    expected = _arithmetic()
    for world, runs in minidist_runs.items():
        for name in NAMES:
            _assert_same(runs[name], expected, f"minidist on {world} process(es), {name}")


@pytest.mark.timeout(600)
def test_the_ported_script_computes_what_torch_computes(minidist_runs, torch_run):
    expected = _arithmetic()
    for name in NAMES:
        _assert_same(torch_run[name], expected, f"torch, {name}")
        _assert_same(minidist_runs[1][name], torch_run[name], f"minidist vs torch, {name}")


def test_every_marked_line_is_the_only_difference():
    ported = SCRIPT.read_text().splitlines()
    torch_lines = to_torch(SCRIPT.read_text()).splitlines()
    changed = [a for a, b in zip(ported, torch_lines) if a != b]
    assert len(ported) == len(torch_lines)
    assert all("# torch:" in line for line in changed) and len(changed) == 7
    assert "from torch.distributed.pipelining import (" in torch_lines
    page = (ROOT / "docs" / "coming_from_torch.md").read_text()
    assert "examples/ported_pipelining.py" in page


# --------------------------------------------------------------------------- in one launch


def _layers():
    nn.init.manual_seed(3)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 5), nn.Tanh(),
                         nn.Linear(5, 2)).double()


def _data():
    rng = np.random.default_rng(5)
    return rng.normal(size=(6, 4)), rng.integers(0, 2, 6)


class _Chained(nn.Module):
    def __init__(self, residual=False):
        super().__init__()
        nn.init.manual_seed(4)
        self.first, self.act, self.second = nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2)
        self.residual = residual

    def forward(self, x):
        h = self.act(self.first(x))
        return self.second(h + x if self.residual else h)


def _attempt(found, name, make):
    try:
        make()
        found[name] = None
    except (ValueError, TypeError, RuntimeError, ImportError) as error:
        found[name] = f"{type(error).__name__}: {error}"


def _one_f_one_b(scale_grads=True, with_loss=True):
    """1F1B over 2 ranks of _layers, cut after the first Tanh."""
    loss_fn = nn.CrossEntropyLoss() if with_loss else None
    rank = dist.get_rank()
    model = _layers()
    piece = model[0:2] if rank == 0 else model[2:5]
    stage = PipelineStage(piece, rank, 2, "cpu")
    return stage, Schedule1F1B(stage, 3, loss_fn=loss_fn, scale_grads=scale_grads)


def _step(schedule, stage, **kwargs):
    x, y = _data()
    if stage.is_first:
        return schedule.step(x, **kwargs)
    return schedule.step(target=y, **kwargs)


def _grads(stage):
    return [None if p.grad is None else p.grad.copy() for p in stage.submod.parameters()]


def _behaviour():
    found = {}
    stage, scaled = _one_f_one_b()
    losses = []
    output = _step(scaled, stage, losses=losses)
    found["scaled"] = _grads(stage)
    found["losses"] = [loss.item() for loss in losses]
    found["output"] = None if output is None else output.data
    # not zeroed: torch divides what .grad held with the new sum
    _step(scaled, stage)
    found["accumulated"] = _grads(stage)

    stage, summed = _one_f_one_b(scale_grads=False)
    _step(summed, stage)
    found["summed"] = _grads(stage)

    stage, scaled = _one_f_one_b()
    evaluated = []
    x, y = _data()
    out = scaled.eval(x) if stage.is_first else scaled.eval(target=y, losses=evaluated)
    found["eval"] = (None if out is None else out.data, [loss.item() for loss in evaluated],
                     _grads(stage))
    stage, inference = _one_f_one_b(with_loss=False)
    out = _step(inference, stage)
    found["no loss_fn"] = (None if out is None else out.data, _grads(stage))
    return found


def _refusals():
    rank = dist.get_rank()
    found = {}
    model = _layers()
    piece = model[0:2] if rank == 0 else model[2:5]
    stage = PipelineStage(piece, rank, 2, "cpu")
    _attempt(found, "list to a one-stage schedule", lambda: ScheduleGPipe([stage], 2))
    _attempt(found, "one stage to a list schedule", lambda: ScheduleInterleaved1F1B(stage, 2))
    _attempt(found, "chunk spec", lambda: ScheduleGPipe(stage, 2, args_chunk_spec=(0,)))
    _attempt(found, "dw_builder",
             lambda: PipelineStage(piece, rank, 2, "cpu", dw_builder=lambda: None))
    _attempt(found, "index out of range", lambda: PipelineStage(piece, 2, 2))
    _attempt(found, "stages a rank", lambda: ScheduleGPipe(PipelineStage(piece, rank, 4), 2))
    pieces = [model[0:2], model[2:4]]
    _attempt(found, "wrong stage indices", lambda: ScheduleInterleaved1F1B(
        [PipelineStage(p, 2 * rank + i, 4) for i, p in enumerate(pieces)], 2))
    schedule = ScheduleGPipe(stage, 2, loss_fn=nn.CrossEntropyLoss())
    x, y = _data()
    _attempt(found, "keyword input", lambda: schedule.step(x, mask=x) if rank == 0
             else schedule.step(target=y, mask=x))
    # each refused before any message, on the one rank that calls it
    if rank == 0:
        _attempt(found, "no input", lambda: schedule.step())
    else:
        _attempt(found, "no target", lambda: schedule.step())
    _attempt(found, "pipe_split", pipe_split)
    _attempt(found, "split_policy", lambda: pipeline(model, (x,), split_policy=lambda g: g))
    _attempt(found, "unknown child", lambda: pipeline(model, (x,), split_spec={
        "layers.2": SplitPoint.BEGINNING}))
    _attempt(found, "residual", lambda: pipeline(_Chained(residual=True), (x,), split_spec={
        "act": SplitPoint.END}))

    def from_distributed():
        from minidist.distributed.pipelining import PipelineStage  # noqa: F401

    _attempt(found, "minidist.distributed.pipelining", from_distributed)
    _attempt(found, "zero bubble, 2 a rank", lambda: ScheduleInterleavedZeroBubble(
        [PipelineStage(p, 2 * i + rank, 4) for i, p in enumerate(pieces)], 2))
    if "zbv" not in SCHEDULES:
        _attempt(found, "missing schedule", lambda: ScheduleZBVZeroBubble(
            [PipelineStage(p, i, 4) for i, p in zip((rank, 3 - rank), pieces)], 2))
    return found


def _cuts():
    x, _ = _data()
    model = _layers()
    pipe = pipeline(model, (x,), split_spec={"2": SplitPoint.BEGINNING, "3": SplitPoint.END})
    chained = pipeline(_Chained(), (x,), split_spec={"act": SplitPoint.END})
    stage = pipe.build_stage(1, "cpu")
    return dict(
        sequential=[[name for name, _ in pipe.get_stage_module(i).named_children()]
                    for i in range(pipe.num_stages)],
        shared=pipe.get_stage_module(0)[0] is model[0],
        chained=[[name for name, _ in chained.get_stage_module(i).named_children()]
                 for i in range(chained.num_stages)],
        stage=(stage.stage_index, stage.num_stages),
        whole=pipeline(model, (x,)).num_stages)


def _worker():
    return _behaviour(), _refusals(), _cuts()


@pytest.fixture(scope="module")
def launched():
    return minidist.launch(_worker, world_size=2, timeout=60)


def _arithmetic_of_layers(scale):
    """_layers on _data in 3 micro-batches in one process: losses, output, gradients."""
    model = _layers()
    x, y = _data()
    losses, outputs = [], []
    for xs, ys in zip(np.array_split(x, 3), np.array_split(y, 3)):
        output = model(Tensor(xs))
        loss = nn.CrossEntropyLoss()(output, ys)
        loss.backward()
        losses.append(loss.item())
        outputs.append(output.data)
    grads = [p.grad / scale for p in model.parameters()]
    return losses, np.concatenate(outputs), grads


def test_scale_grads_losses_outputs_and_accumulation_are_torchs(launched):
    losses, output, grads = _arithmetic_of_layers(3)
    _, _, summed = _arithmetic_of_layers(1)
    held = [g for result in launched for g in result[0]["scaled"]]
    np.testing.assert_allclose(np.concatenate([g.ravel() for g in held]),
                               np.concatenate([g.ravel() for g in grads]), rtol=RTOL)
    total = [g for result in launched for g in result[0]["summed"]]
    for got, want in zip(total, summed):
        np.testing.assert_allclose(got, want, rtol=RTOL)
    # two steps without zero_grad: (g / 3 + 3 g) / 3, torch's order of operations
    again = [g for result in launched for g in result[0]["accumulated"]]
    for got, want in zip(again, grads):
        np.testing.assert_allclose(got, (want + 3 * want) / 3, rtol=RTOL)
    first, last = launched[0][0], launched[1][0]
    assert first["output"] is None and first["losses"] == []
    np.testing.assert_allclose(last["losses"], losses, rtol=RTOL)
    np.testing.assert_allclose(last["output"], output, rtol=RTOL)


def test_eval_and_no_loss_fn_run_the_forwards_only(launched):
    losses, output, _ = _arithmetic_of_layers(3)
    first, last = launched[0][0], launched[1][0]
    assert first["eval"][0] is None and first["no loss_fn"][0] is None
    np.testing.assert_allclose(last["eval"][0], output, rtol=RTOL)
    np.testing.assert_allclose(last["eval"][1], losses, rtol=RTOL)
    np.testing.assert_allclose(last["no loss_fn"][0], output, rtol=RTOL)
    for result in launched:
        assert all(g is None for g in result[0]["eval"][2] + result[0]["no loss_fn"][1])


def test_what_differs_from_torch_is_refused_saying_what_to_write(launched):
    for rank, (_, found, _) in enumerate(launched):
        assert "ScheduleGPipe takes one PipelineStage" in found["list to a one-stage schedule"]
        assert "ScheduleInterleaved1F1B takes a list" in found["one stage to a list schedule"]
        assert "TensorChunkSpec(0)); leave it out" in found["chunk spec"]
        assert "makes each weight half W itself" in found["dw_builder"]
        assert "Stage index 2 is out of range of 2" in found["index out of range"]
        assert "4 stages over 2 ranks is 2 a rank, this rank passed 1" in found["stages a rank"]
        held = [[0, 2], [1, 3]][rank]
        assert (f"rank {rank}: got stages {[2 * rank, 2 * rank + 1]}; on schedule "
                f"'interleaved_1f1b' (loop placement, 2 ranks x 2 stages) this rank holds "
                f"stages {held}") in found["wrong stage indices"]
        assert "stages take one positional input" in found["keyword input"]
        if rank == 0:
            assert "rank 0 holds the first stage: step() takes the model's one input" \
                in found["no input"]
        else:
            assert "rank 1 holds the last stage: step() needs target=" in found["no target"]
        assert "minidist does not trace forward" in found["pipe_split"]
        assert "rewrites torch's traced graph" in found["split_policy"]
        assert "'layers.2', which is not a child" in found["unknown child"]
        assert "_Chained's forward is not its children called one after another" \
            in found["residual"]
        assert ("write `from minidist.parallel.pipeline.pipelining import PipelineStage`"
                in found["minidist.distributed.pipelining"])
        assert ("ScheduleInterleavedZeroBubble: minidist's 'zb_h1' holds 1 stage(s) a rank, "
                "this rank passed 2; pass 1 a rank (several stages a rank: "
                "ScheduleInterleaved1F1B") in found["zero bubble, 2 a rank"]
        if "missing schedule" in found:
            assert "runs minidist's 'zbv' schedule, which this minidist does not have" \
                in found["missing schedule"]


def test_pipeline_cuts_between_children_at_split_points(launched):
    cuts = launched[0][2]
    assert cuts["sequential"] == [["0", "1"], ["2", "3"], ["4"]]
    assert cuts["shared"] is True
    assert cuts["chained"] == [["first", "act"], ["second"]]
    assert cuts["stage"] == (1, 3)
    assert cuts["whole"] == 1
