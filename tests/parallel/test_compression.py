"""Gradient compression hooks (minidist.parallel.data.compression, .powersgd, .hooks).

Unit tests of the compressors without processes, then one launch per world
size: the identity hook equals plain DDP bit for bit, every hook trains the
digits MLP without error, all ranks end with identical weights, a hook with
the wrong output is named, and the fp16 hook stays within its error bound.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, optim, trace
from minidist.data import load_digits
from minidist.parallel.data import compression as C
from minidist.parallel.data.ddp import DistributedDataParallel
from minidist.parallel.data.hooks import HOOKS
from minidist.parallel.data.powersgd import PowerSGDState, orthogonalize, powersgd_hook

# --------------------------------------------------------------------------- units


def test_int8_is_unbiased_and_in_range():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(50).astype(np.float64)
    draws = 4000
    mean = np.zeros_like(x)
    for _ in range(draws):
        q, scale = C.quantize_int8(x, rng)
        assert q.dtype == np.int8 and np.abs(q.astype(int)).max() <= 127
        mean += q * scale
    mean /= draws
    step = np.abs(x).max() / 127
    # each draw is off by less than one step: the mean of 4000 by ~ step / sqrt(4000)
    assert np.abs(mean - x).max() < 5 * step / np.sqrt(draws)
    q, scale = C.quantize_int8(np.zeros(5), rng)
    assert scale == 0.0 and not q.any()


def test_fp16_round_trip_error_bound():
    x = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    back = x.astype(np.float16).astype(np.float32)
    assert np.all(np.abs(back - x) <= np.abs(x) * 2.0**-11 + 2.0**-24)


def test_topk_keeps_exactly_k_largest():
    p = np.random.default_rng(2).standard_normal(100)
    indices, values = C.compress_topk(p, 7)
    assert indices.size == 7 and len(set(indices)) == 7
    assert set(indices) == set(np.argsort(-np.abs(p))[:7])
    np.testing.assert_array_equal(values, p[indices])
    assert C.TopKState(0.05).k(100) == 5 and C.TopKState(0.001).k(100) == 1


def test_randomk_keeps_exactly_k_distinct():
    p = np.random.default_rng(3).standard_normal(100)
    indices, values = C.compress_randomk(p, 9, np.random.default_rng(0))
    assert indices.size == 9 and len(set(indices)) == 9
    np.testing.assert_array_equal(values, p[indices])


@pytest.mark.parametrize("quantize", [True, False])
def test_threshold_keeps_exactly_entries_above_tau(quantize):
    p = np.array([0.5, -0.05, 0.2, -0.3, 0.1, 0.0, -0.1])
    indices, values = C.compress_threshold(p, 0.1, quantize)
    assert list(indices) == [0, 2, 3]
    expected = [0.1, 0.1, -0.1] if quantize else [0.5, 0.2, -0.3]
    np.testing.assert_array_equal(values, expected)


def test_sign_packs_one_bit_per_value():
    p = np.array([0.5, -1.5, 0.0, 2.0, -1.0, 1.0, 3.0, -4.0, 0.5])
    bits, scale, sent = C.compress_sign(p)
    assert bits.dtype == np.uint8 and bits.size == 2
    assert scale == pytest.approx(np.abs(p).mean())
    np.testing.assert_array_equal(np.unpackbits(bits, count=p.size).astype(bool), p >= 0)
    np.testing.assert_array_equal(sent, np.where(p >= 0, scale, -scale))


def test_bf16_truncation_error_bound():
    x = np.random.default_rng(5).standard_normal(1000).astype(np.float32) * 1e3
    bits = C.truncate_bf16(x)
    assert bits.dtype == np.uint16 and bits.nbytes == x.nbytes // 2
    back = C.expand_bf16(bits)
    # truncation keeps 7 mantissa bits: off by less than 2^-7 of the value, towards zero
    assert np.all(np.abs(back - x) < np.abs(x) * 2.0**-7)
    assert np.all(np.abs(back) <= np.abs(x)) and np.all(np.sign(back) == np.sign(x))
    big = np.array([3e38, -1e-30], np.float32)     # float32's range, which float16 lacks
    np.testing.assert_allclose(C.expand_bf16(C.truncate_bf16(big)), big, rtol=2.0**-7)


def test_powersgd_layout_compresses_only_what_pays():
    state = PowerSGDState(matrix_approximation_rank=2)
    layout = state.layout([(64, 128), (128,), (16, 1, 3, 3), (3, 2)])
    assert layout[0] == (0, 8192, 64, 128, 2)          # 8192 >= 2 * (64 + 128) * 2
    assert layout[1] == (8192, 128, 128, 1, 0)          # a vector goes whole
    assert layout[2] == (8320, 144, 16, 9, 2)           # conv: out x (in kh kw)
    assert layout[3][-1] == 0                           # 6 < 2 * (3 + 2) * 2: whole
    assert PowerSGDState(matrix_approximation_rank=5).layout([(3, 4)])[0][-1] == 0
    q = orthogonalize(np.random.default_rng(0).standard_normal((10, 3)))
    np.testing.assert_allclose(q.T @ q, np.eye(3), atol=1e-12)
    with pytest.raises(ValueError, match="matrix_approximation_rank"):
        PowerSGDState(None, 0)
    with pytest.raises(ValueError, match="start_powerSGD_iter"):
        PowerSGDState(None, 1, start_powerSGD_iter=-1)
    # torch: "Expect `start_powerSGD_iter` > 1 if `use_error_feedback` or `warm_start`"
    for start in (0, 1):
        with pytest.raises(ValueError, match="expect start_powerSGD_iter > 1, as torch"):
            PowerSGDState(None, 1, start_powerSGD_iter=start)
        with pytest.raises(ValueError, match="expect start_powerSGD_iter > 1"):
            PowerSGDState(None, 1, start_powerSGD_iter=start, use_error_feedback=False)
        assert PowerSGDState(None, 1, start_powerSGD_iter=start, use_error_feedback=False,
                               warm_start=False).start_powerSGD_iter == start


def test_without_error_feedback_nothing_is_kept():
    state = C.TopKState(0.1, use_error_feedback=False)
    p = state.compensate(0, np.arange(10.0))
    state.update(0, p, np.zeros(10))
    assert state.residuals == {}
    np.testing.assert_array_equal(state.compensate(0, np.ones(10)), np.ones(10))


@pytest.mark.parametrize("compressor", ["sign", "threshold", "topk", "randomk"])
def test_error_feedback_loses_nothing(compressor):
    """sent + residual, summed over the steps, equals the summed gradients."""
    rng = np.random.default_rng(4)
    state = {"sign": C.ErrorFeedbackState(), "threshold": C.ThresholdState(0.5),
             "topk": C.TopKState(0.1), "randomk": C.RandomKState(0.1)}[compressor]
    total_sent, total_grad = np.zeros(40), np.zeros(40)
    for _ in range(25):
        g = rng.standard_normal(40)
        total_grad += g
        p = state.compensate(0, g)
        if compressor == "sign":
            sent = C.compress_sign(p)[2]
        else:
            if compressor == "threshold":
                indices, values = C.compress_threshold(p, state.tau)
            elif compressor == "topk":
                indices, values = C.compress_topk(p, state.k(p.size))
            else:
                indices, values = C.compress_randomk(p, state.k(p.size), state.rng(0))
            sent = C._scatter(indices, values, p.size, p.dtype)
            assert np.count_nonzero(sent) == indices.size
        state.update(0, p, sent)
        total_sent += sent
    np.testing.assert_allclose(total_sent + state.residuals[0], total_grad, atol=1e-12)


# --------------------------------------------------------------------------- with processes

STEPS = 4
BATCH = 8


def _model(seed):
    nn.init.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 24), nn.ReLU(), nn.Linear(24, 16), nn.ReLU(),
                         nn.Linear(16, 10))


def _state(name):
    return {"allreduce": None, "fp16": None, "bf16": None, "int8": C.Int8State(seed=1),
            "sign": C.ErrorFeedbackState(), "threshold": C.ThresholdState(1e-3),
            "topk": C.TopKState(0.1), "randomk": C.RandomKState(0.1, seed=1),
            "powersgd": PowerSGDState(matrix_approximation_rank=2, random_seed=1,
                                        start_powerSGD_iter=2)}[name]


def _train(hook_name, overlap=True):
    rank, world = dist.get_rank(), dist.get_world_size()
    model = _model(seed=rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.002, overlap=overlap)
    if hook_name is not None:
        ddp.register_comm_hook(_state(hook_name), HOOKS[hook_name])
    optimizer = optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x, y = load_digits()[:2]
    losses = []
    for step in range(STEPS):
        start = (step * world + rank) * BATCH
        size = BATCH - 3 if rank == world - 1 else BATCH   # uneven shards
        optimizer.zero_grad(set_to_none=False)
        loss = loss_fn(ddp(Tensor(x[start:start + size])), y[start:start + size])
        loss.backward()
        optimizer.step()
        losses.append(float(loss.data))
    weights = np.concatenate([p.data.reshape(-1) for p in model.parameters()])
    return weights, losses


def _bad_hook(state, bucket):
    return bucket.buffer()[:-1]


def _wrong_output_message():
    ddp = DistributedDataParallel(_model(0), bucket_cap_mb=0.002)
    ddp.register_comm_hook(None, _bad_hook)
    x, y = load_digits()[:2]
    try:
        nn.CrossEntropyLoss()(ddp(Tensor(x[:4])), y[:4]).backward()
    except ValueError as error:
        return str(error)
    return ""


class _FakeBucket:
    def __init__(self, array, divisor, shapes=None):
        self._array, self._divisor = array, divisor
        self._shapes = shapes or [array.shape]
        self.group, self.world_size, self.rank = None, dist.get_world_size(), dist.get_rank()
        self.algorithm = "auto"

    def parameters(self):
        return [Tensor(np.zeros(shape)) for shape in self._shapes]

    def is_last(self):
        return True

    def buffer(self):
        return self._array

    def divisor(self):
        return self._divisor

    def index(self):
        return 0


def _fp16_error():
    world = dist.get_world_size()
    x = np.random.default_rng(dist.get_rank()).standard_normal(500).astype(np.float32)
    exact = x.copy()
    dist.all_reduce(exact)
    exact /= np.float32(world)
    got = C.fp16_compress_hook(None, _FakeBucket(x.copy(), world))
    return float(np.max(np.abs(got - exact)) / np.max(np.abs(exact)))


def _powersgd_checks():
    """(1) a sum of ranks' gradients of rank <= r comes back exactly; (2)
    with error feedback, the outputs summed over steps plus the ranks'
    residuals equal the summed contributions (nothing lost, only delayed)."""
    rank = dist.get_rank()
    rng = np.random.default_rng(10 + rank)
    shapes = [(12, 10), (10,)]
    # (1) each rank a rank-1 matrix: their sum has rank <= world <= r = 4
    low = np.concatenate([np.outer(rng.standard_normal(12), rng.standard_normal(10)).ravel(),
                          rng.standard_normal(10)])
    exact = low.copy()
    dist.all_reduce(exact)
    state = PowerSGDState(matrix_approximation_rank=4, random_seed=3, start_powerSGD_iter=0,
                            use_error_feedback=False, warm_start=False)
    got = powersgd_hook(state, _FakeBucket(low.copy(), 1, shapes))
    exact_error = float(np.max(np.abs(got - exact)))
    # (2) rank 2 of random gradients, 6 steps
    state = PowerSGDState(matrix_approximation_rank=2, random_seed=3, start_powerSGD_iter=2)
    sent, given = np.zeros(130), np.zeros(130)
    for _ in range(8):                 # 2 plain all-reduces (torch's warm-up), 6 compressed
        c = rng.standard_normal(130)
        given += c
        sent += powersgd_hook(state, _FakeBucket(c.copy(), 1, shapes))
    dist.all_reduce(given)
    residuals = state.residuals[0].copy()
    dist.all_reduce(residuals)
    feedback_error = float(np.max(np.abs(sent + residuals - given)))
    return exact_error, feedback_error


def _worker():
    plain = [_train(None, overlap) for overlap in (True, False)]
    hooked = {name: _train(name) for name in HOOKS}
    identity_no_overlap = _train("allreduce", overlap=False)
    again = {name: _train(name) for name in ("int8", "randomk", "powersgd")}
    return (plain, hooked, identity_no_overlap, _wrong_output_message(), _fp16_error(),
            _powersgd_checks(), again)


@pytest.mark.blas_kernel
@pytest.mark.timeout(240)
@pytest.mark.parametrize("world_size", [2, 3])
def test_hooks_in_ddp(world_size):
    results = minidist.launch(_worker, world_size=world_size, transport="shm", timeout=120)
    for plain, hooked, identity_no_overlap, message, fp16_error, powersgd, again in results:
        for name, (weights, _) in again.items():   # seeded draws: the same run twice
            np.testing.assert_array_equal(weights, hooked[name][0], err_msg=name)
        # the identity hook is DDP's path, bit for bit, overlapped or not
        np.testing.assert_array_equal(hooked["allreduce"][0], plain[0][0])
        np.testing.assert_array_equal(identity_no_overlap[0], plain[1][0])
        for name, (weights, losses) in hooked.items():
            assert np.all(np.isfinite(weights)) and np.all(np.isfinite(losses)), name
            if name not in ("allreduce", "fp16"):   # lossy: the hook really ran
                assert not np.array_equal(weights, plain[0][0]), name
        assert "_bad_hook" in message and "bucket 0" in message
        assert fp16_error < world_size * 2.0**-10
        exact_error, feedback_error = powersgd
        assert exact_error < 1e-10 and feedback_error < 1e-10, powersgd
    for name in HOOKS:   # every rank ends with identical weights
        for rank_result in results[1:]:
            np.testing.assert_array_equal(rank_result[1][name][0], results[0][1][name][0],
                                          err_msg=name)


# --------------------------------------------------------------------------- bytes on the wire


def _traced_worker():
    sizes = None
    for name in HOOKS:
        ddp = DistributedDataParallel(_model(0), bucket_cap_mb=0.002, algorithm="ring")
        ddp.register_comm_hook(_state(name), HOOKS[name])
        sizes = [[p.data.shape for p in bucket] for bucket in ddp.buckets]
        x, y = load_digits()[:2]
        start = dist.get_rank() * BATCH

        def step(ddp=ddp, x=x[start:start + BATCH], y=y[start:start + BATCH]):
            nn.CrossEntropyLoss()(ddp(Tensor(x)), y).backward()

        for _ in range(getattr(ddp._comm_hook[0], "start_powerSGD_iter", 0)):
            step()   # PowerSGD's warm-up: plain all-reduces, not counted
        with trace.region(f"hook {name}"):
            for _ in range(STEPS):
                step()
    return sizes


def _powersgd_values(shapes):
    layout = PowerSGDState(matrix_approximation_rank=2).layout(shapes)
    return sum(r * (n + m) if r else size for (_, size, n, m, r) in layout)


def _formula(name, buckets, world_size, s=4):
    """Bytes one rank sends per step, from each hook's docstring (plus the
    8-byte example count DDP all-reduces once a step)."""
    others = world_size - 1
    count = 2 * others / world_size * 8
    per_bucket = {
        "allreduce": lambda n: 2 * others / world_size * n * s,
        "fp16": lambda n: 2 * others / world_size * n * 2,
        "bf16": lambda n: others * n * 2,
        "int8": lambda n: others * (n + 8),
        "sign": lambda n: others * (-(-n // 8) + 8),
        "topk": lambda n: others * (8 + C.TopKState(0.1).k(n) * (4 + s)),
        "randomk": lambda n: others * (8 + C.TopKState(0.1).k(n) * (4 + s)),
    }
    if name == "powersgd":   # two all-reduces: P (with the vectors) and Q
        return count + sum(2 * others / world_size * _powersgd_values(shapes) * s
                           for shapes in buckets)
    return count + sum(per_bucket[name](sum(int(np.prod(x)) for x in shapes))
                       for shapes in buckets)


@pytest.mark.timeout(120)
def test_bytes_per_step_from_the_trace_match_the_formulas(tmp_path):
    path = tmp_path / "hooks.jsonl"
    world_size = 2
    sizes = minidist.launch(_traced_worker, world_size=world_size, transport="shm",
                            trace=str(path), timeout=60)[0]
    events = trace.read_jsonl(path).events
    dense = _formula("allreduce", sizes, world_size)
    for rank in range(world_size):
        regions = {e["label"].split()[1]: (e["start"], e["end"]) for e in events
                   if e["rank"] == rank and e["kind"] == "compute"
                   and e["label"].startswith("hook ")}
        for name, (begin, end) in regions.items():
            sent = sum(e["bytes"] for e in events if e["rank"] == rank and e["kind"] == "send"
                       and begin <= e["start"] <= end
                       and trace.label_info(e["label"]).get("call") is not None) / STEPS
            if name == "threshold":   # data-dependent: m entries over tau
                assert 0 < sent < dense, (name, sent, dense)
            else:
                assert sent == pytest.approx(_formula(name, sizes, world_size)), (name, rank)
        assert len(regions) == len(HOOKS)
