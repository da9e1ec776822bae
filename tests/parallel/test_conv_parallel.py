"""Channel-parallel and spatial-parallel Conv2d must equal the unsplit layer.

One launch per world size (1, 2, 3, 4), traced, runs every case inside the
workers: (kernel, stride, padding) from a 1x1 kernel (no halo) to a 5x5 on
bands thinner than its halo (rows come from two ranks away), with and without
bias, output channels that do not divide by the world size. Each rank returns
its shards (output, input gradient, weight and bias gradients) and the halo
messages its trace recorded; the parent assembles the shards and compares
them with the unsplit Conv2d to float32 round-off, and checks that the halo
exchange moved exactly the rows :func:`halo_plan` says, with the bytes that
makes, and that the channel split's all_gather and all_reduce sent, rank by
rank, exactly the bytes :func:`channel_parallel_bytes` says. The same
launches check the errors for shapes that cannot be split.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, trace
from minidist.parallel.model.channel_parallel import ChannelParallelConv2d, channel_parallel_bytes
from minidist.parallel.model.spatial_parallel import SpatialParallelConv2d, halo_plan
from minidist.parallel.model.split_conv import band

WORLD_SIZES = (1, 2, 3, 4)
N, C_IN = 2, 3

# name, out_channels, height, width, kernel, stride, padding, bias
CASES = [
    ("3x3 same", 5, 9, 5, 3, 1, 1, True),
    ("3x3 valid", 4, 10, 6, 3, 1, 0, True),
    ("3x3 stride 2", 5, 9, 7, 3, 2, 1, False),
    ("5x5 thin bands", 6, 6, 4, 5, 1, 2, True),
    ("1x1 no halo", 5, 7, 3, 1, 1, 0, True),
    ("4x2 stride 3x1", 5, 11, 5, (4, 2), (3, 1), (1, 0), True),
    ("2x2 stride 2", 4, 8, 4, 2, 2, 0, True),
]


def _pair(value):
    return value if isinstance(value, tuple) else (value, value)


def _case_data(index, case):
    """The unsplit conv, input and output weights of the loss, the same on every rank."""
    _, out_channels, height, width, kernel, stride, padding, bias = case
    conv = nn.Conv2d(C_IN, out_channels, kernel, stride, padding, bias=bias, rng=100 + index)
    rng = np.random.default_rng(index)
    x = rng.standard_normal((N, C_IN, height, width)).astype(np.float32)
    out_h = (height + 2 * _pair(padding)[0] - _pair(kernel)[0]) // _pair(stride)[0] + 1
    out_w = (width + 2 * _pair(padding)[1] - _pair(kernel)[1]) // _pair(stride)[1] + 1
    loss_weights = rng.standard_normal((N, out_channels, out_h, out_w)).astype(np.float32)
    return conv, x, loss_weights


def _spatial_fits(case, world):
    _, _, height, _, kernel, stride, padding, _ = case
    return height >= world and halo_plan(height, _pair(kernel)[0], _pair(stride)[0],
                                         _pair(padding)[0], world).output_height >= world


def _halo_sends(events):
    """(direction, source, destination, rows, bytes) of every halo message sent."""
    sends = []
    for event in events:
        event = dict(zip(trace.FIELDS, event))
        info = trace.label_info(event["label"])
        if event["kind"] == "send" and "halo" in info:
            sends.append((info["halo"], event["rank"], event["peer"], info["rows"],
                          event["bytes"]))
    return sends


def _sent_bytes(events):
    """Bytes of the send events among ``events`` (this rank's trace)."""
    return sum(event["bytes"] for event in (dict(zip(trace.FIELDS, e)) for e in events)
               if event["kind"] == "send")


def _grads(layer):
    return (layer.weight.grad.copy(),
            None if layer.bias is None else layer.bias.grad.copy())


def _errors(world):
    """Shapes that cannot be split: the message each raises (None: no error)."""
    rank = dist.get_rank()
    conv = nn.Conv2d(C_IN, 4, 3, padding=1, rng=0)
    attempts = []
    # Fewer rows than ranks: the image is split by the band rule, some get 0.
    start, stop = band(world - 1, world, rank)
    attempts.append(lambda rows=stop - start: SpatialParallelConv2d.from_conv(conv)(
        np.zeros((1, C_IN, rows, 4), np.float32)))
    # Enough input rows but fewer output rows than ranks (stride 4).
    strided = nn.Conv2d(C_IN, 4, 3, stride=4, rng=0)
    height = 4 * (world - 1) + 2
    start, stop = band(height, world, rank)
    attempts.append(lambda rows=stop - start: SpatialParallelConv2d.from_conv(strided)(
        np.zeros((1, C_IN, rows, 4), np.float32)))
    # Bands that do not follow the rule: the last rank holds the extra row.
    rows = 3 if rank == world - 1 else 2
    attempts.append(lambda: SpatialParallelConv2d.from_conv(conv)(
        np.zeros((1, C_IN, rows, 4), np.float32)))
    # Fewer output channels than ranks.
    attempts.append(lambda: ChannelParallelConv2d.from_conv(
        nn.Conv2d(C_IN, world - 1 or 1, 3, rng=0)) if world > 1 else None)
    messages = []
    for attempt in attempts:
        try:
            attempt()
            messages.append(None)
        except ValueError as error:
            messages.append(str(error))
    return messages


def _worker():
    rank, world = dist.get_rank(), dist.get_world_size()
    recorder = trace.current()
    results = {}
    for index, case in enumerate(CASES):
        conv, x, loss_weights = _case_data(index, case)
        channel = ChannelParallelConv2d.from_conv(conv)
        x_whole = Tensor(x, requires_grad=True)
        first = len(recorder.events)
        y = channel(x_whole)
        middle = len(recorder.events)
        (y * Tensor(loss_weights)).sum().backward()
        sent = (_sent_bytes(recorder.events[first:middle]),
                _sent_bytes(recorder.events[middle:]))
        results[("channel", index)] = ((y.data.copy(), x_whole.grad.copy()) + _grads(channel)
                                       + (sent,))
        if not _spatial_fits(case, world):
            continue
        spatial = SpatialParallelConv2d.from_conv(conv)
        start, stop = band(x.shape[2], world, rank)
        x_band = Tensor(x[:, :, start:stop].copy(), requires_grad=True)
        first = len(recorder.events)
        y = spatial(x_band)
        out_start, out_stop = spatial.last_plan.output_bands[rank]
        (y * Tensor(loss_weights[:, :, out_start:out_stop].copy())).sum().backward()
        results[("spatial", index)] = (y.data.copy(), x_band.grad.copy()) + _grads(spatial) + (
            _halo_sends(recorder.events[first:]),)
    return results, _errors(world)


@pytest.fixture(scope="module", params=WORLD_SIZES, ids=lambda p: f"world{p}")
def run(request, tmp_path_factory):
    world = request.param
    path = tmp_path_factory.mktemp("conv") / f"conv{world}.jsonl"
    return world, minidist.launch(_worker, world_size=world, transport="shm", trace=str(path))


def _reference(index, case):
    conv, x, loss_weights = _case_data(index, case)
    x_whole = Tensor(x, requires_grad=True)
    y = conv(x_whole)
    (y * Tensor(loss_weights)).sum().backward()
    bias = None if conv.bias is None else conv.bias.grad
    return y.data, x_whole.grad, conv.weight.grad, bias


def _close(name, got, want):
    scale = 1.0 + float(np.abs(want).max())
    error = float(np.abs(got - want).max())
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    assert error <= 2e-6 * scale, f"{name}: max error {error:.3g} (scale {scale:.3g})"


def test_channel_parallel_equals_unsplit_conv(run):
    world, results = run
    for index, case in enumerate(CASES):
        want = _reference(index, case)
        shards = [results[rank][0][("channel", index)] for rank in range(world)]
        name = f"{case[0]}, world {world}"
        for rank, shard in enumerate(shards):
            # Every rank ends with the whole output and the whole input gradient.
            _close(f"{name}: output on rank {rank}", shard[0], want[0])
            _close(f"{name}: input gradient on rank {rank}", shard[1], want[1])
        _close(f"{name}: weight gradient", np.concatenate([s[2] for s in shards]), want[2])
        if want[3] is not None:
            _close(f"{name}: bias gradient", np.concatenate([s[3] for s in shards]), want[3])


def test_channel_parallel_bytes_in_the_trace_equal_the_formula(run):
    """Per rank, the bytes of the send events in forward (the all_gather of
    the output, padded to the widest slice) and in backward (the all_reduce
    of the input gradient) equal :func:`channel_parallel_bytes`, exactly:
    the cases include channels that do not divide (padding) and input
    gradients whose ring chunks are uneven, so a formula off by one chunk or
    one padded channel on any rank fails."""
    world, results = run
    uneven_chunks = padded = 0
    for index, case in enumerate(CASES):
        _, out_channels, height, width, _, _, _, _ = case
        y, x_grad = results[0][0][("channel", index)][:2]
        forward, backward = channel_parallel_bytes(
            N, C_IN, out_channels, height, width, y.shape[2], y.shape[3], world)
        sent = [results[rank][0][("channel", index)][4] for rank in range(world)]
        assert [s[0] for s in sent] == list(forward), (case[0], world, "forward")
        assert [s[1] for s in sent] == list(backward), (case[0], world, "backward")
        assert x_grad.size == N * C_IN * height * width
        uneven_chunks += x_grad.size % world != 0
        padded += out_channels % world != 0
        if world == 1:
            assert forward == backward == (0,)
    if world > 1:
        # The uneven cases are there: channels that do not divide on every
        # world size; input gradients (N * 3 * H * W values) whose ring chunks
        # differ on 4 ranks (on 2 and 3 they always divide).
        assert padded > 0
        assert uneven_chunks > 0 or world in (2, 3)


def test_channel_parallel_bytes_formula_by_hand():
    # 5 channels on 2 ranks: slices 3 and 2, padded to 3; N=2, OH=OW=2:
    # piece 2*3*2*2 = 24 values, (n - 1) * 24 forward. Input 2*3*3*3 = 54
    # values on 2 ranks: the ring all_reduce sends 54 (n = 2: N values).
    assert channel_parallel_bytes(2, 3, 5, 3, 3, 2, 2, 2) == ((96, 96), (216, 216))
    # 10 input values on 4 ranks: chunks 3, 3, 2, 2 -> 15, 16, 15, 14 values.
    assert channel_parallel_bytes(1, 1, 4, 2, 5, 1, 1, 4, itemsize=1) == (
        (3, 3, 3, 3), (15, 16, 15, 14))
    with pytest.raises(ValueError, match="world_size >= 1"):
        channel_parallel_bytes(1, 1, 4, 2, 5, 1, 1, 0)


def test_spatial_parallel_equals_unsplit_conv(run):
    world, results = run
    checked = 0
    for index, case in enumerate(CASES):
        if not _spatial_fits(case, world):
            continue
        checked += 1
        want = _reference(index, case)
        shards = [results[rank][0][("spatial", index)] for rank in range(world)]
        name = f"{case[0]}, world {world}"
        _close(f"{name}: output", np.concatenate([s[0] for s in shards], axis=2), want[0])
        _close(f"{name}: input gradient", np.concatenate([s[1] for s in shards], axis=2),
               want[1])
        for rank, shard in enumerate(shards):
            # The weight gradient is all-reduced: whole on every rank.
            _close(f"{name}: weight gradient on rank {rank}", shard[2], want[2])
            if want[3] is not None:
                _close(f"{name}: bias gradient on rank {rank}", shard[3], want[3])
    assert checked >= len(CASES) - 1


def test_halo_exchange_moves_exactly_the_planned_rows(run):
    world, results = run
    for index, case in enumerate(CASES):
        if not _spatial_fits(case, world):
            continue
        _, _, height, width, kernel, stride, padding, _ = case
        plan = halo_plan(height, _pair(kernel)[0], _pair(stride)[0], _pair(padding)[0], world)
        sends = [send for rank in range(world)
                 for send in results[rank][0][("spatial", index)][4]]
        row_bytes = N * C_IN * width * 4
        planned = sorted(("forward", source, destination, (start, stop), (stop - start) * row_bytes)
                         for source, destination, start, stop in plan.transfers)
        backward = sorted(("backward", destination, source, (start, stop),
                           (stop - start) * row_bytes)
                          for source, destination, start, stop in plan.transfers)
        assert sorted(s for s in sends if s[0] == "forward") == planned, case[0]
        assert sorted(s for s in sends if s[0] == "backward") == backward, case[0]
        moved = sum(s[4] for s in sends if s[0] == "forward")
        assert moved == plan.rows_moved() * row_bytes
        if world > 1 and case[0] == "3x3 same":
            # The 3x3 rule: one row to each neighbour, 2 (P - 1) rows in all.
            assert plan.rows_moved() == 2 * (world - 1)
        if case[0] == "1x1 no halo":
            assert sends == []


def test_shapes_that_cannot_be_split_say_why(run):
    world, results = run
    for rank in range(world):
        fewer_rows, fewer_output_rows, bad_bands, few_channels = results[rank][1]
        assert "fewer than the" in fewer_rows and "dimension H" in fewer_rows
        assert f"{world} ranks" in fewer_rows and "SpatialParallelConv2d" in fewer_rows
        if world == 1:
            assert "does not fit in H=2 rows" in fewer_output_rows
            assert bad_bands is None and few_channels is None
            continue
        assert "dimension OH" in fewer_output_rows and f"{world} ranks" in fewer_output_rows
        assert "band rule" in bad_bands
        assert "ChannelParallelConv2d" in few_channels and "C_out" in few_channels
        assert f"over {world} ranks" in few_channels


def test_band_rule_and_halo_plan_without_processes():
    assert [band(10, 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]
    plan = halo_plan(9, 3, 1, 1, 3)
    assert plan.input_bands == plan.output_bands == ((0, 3), (3, 6), (6, 9))
    # The classic picture: each border row goes to the neighbour across it.
    assert plan.transfers == ((1, 0, 3, 4), (0, 1, 2, 3), (2, 1, 6, 7), (1, 2, 5, 6))
    assert plan.windows == ((-1, 5), (2, 5), (5, 5))
    # The halo does not grow with the image: 2 (P - 1) rows for 3x3, stride 1.
    for height in (8, 64, 1024):
        assert halo_plan(height, 3, 1, 1, 4).rows_moved() == 6
    # Bands thinner than the halo read from two ranks away.
    thin = halo_plan(6, 5, 1, 2, 4)
    assert (1, 3, 3, 4) in thin.transfers


def _user_message_with_the_halo_tag_in_flight():
    """Each rank sends its neighbours a message of its own with the halo's
    tag before a spatial conv and receives it after: the halo runs in its own
    context, so neither side takes the other's message."""
    from minidist.distributed.process_group import channel_id
    from minidist.parallel.model.spatial_parallel import HALO_CONTEXT, HALO_GRAD_TAG, HALO_TAG

    rank, world = dist.get_rank(), dist.get_world_size()
    recorder = trace.current()
    conv = nn.Conv2d(C_IN, 4, 3, padding=1, rng=7)
    x = np.random.default_rng(3).standard_normal((N, C_IN, 8, 5)).astype(np.float32)
    start, stop = band(8, world, rank)
    neighbours = [peer for peer in (rank - 1, rank + 1) if 0 <= peer < world]
    mine = {tag: np.full(3, 100 * rank + tag % 10, np.float64) for tag in (HALO_TAG, HALO_GRAD_TAG)}
    sends = [dist.isend(mine[tag], dst=peer, tag=tag) for peer in neighbours for tag in mine]
    first = len(recorder.events)
    x_band = Tensor(x[:, :, start:stop].copy(), requires_grad=True)
    layer = SpatialParallelConv2d.from_conv(conv)
    y = layer(x_band)
    y.sum().backward()
    halo_channels = {dict(zip(trace.FIELDS, e))["channel"] for e in recorder.events[first:]
                     if "halo" in trace.label_info(dict(zip(trace.FIELDS, e))["label"])}
    got = {}
    for peer in neighbours:
        for tag in mine:
            box = np.empty(3, np.float64)
            dist.recv(box, src=peer, tag=tag)
            got[(peer, tag)] = box.tolist()
    dist.wait_all(sends)
    return y.data, x_band.grad, got, halo_channels, channel_id(HALO_CONTEXT)


def test_halo_messages_do_not_mix_with_user_messages_of_the_same_tag(tmp_path):
    from minidist.parallel.model.spatial_parallel import HALO_GRAD_TAG, HALO_TAG

    world = 3
    results = minidist.launch(_user_message_with_the_halo_tag_in_flight, world_size=world,
                              transport="shm", trace=str(tmp_path / "mixed.jsonl"))
    conv = nn.Conv2d(C_IN, 4, 3, padding=1, rng=7)
    x = Tensor(np.random.default_rng(3).standard_normal((N, C_IN, 8, 5)).astype(np.float32),
               requires_grad=True)
    y = conv(x)
    y.sum().backward()
    _close("output", np.concatenate([r[0] for r in results], axis=2), y.data)
    _close("input gradient", np.concatenate([r[1] for r in results], axis=2), x.grad)
    for rank, (_, _, got, channels, halo_channel) in enumerate(results):
        for (peer, tag), values in got.items():
            assert values == [100 * peer + tag % 10] * 3, (rank, peer, tag)
        assert {(peer, tag) for peer, tag in got} == {
            (peer, tag) for peer in (rank - 1, rank + 1) if 0 <= peer < world
            for tag in (HALO_TAG, HALO_GRAD_TAG)}
        assert channels == {halo_channel}, channels


def test_grouped_convolutions_are_refused_by_name():
    from minidist.parallel.model.channel_parallel import ChannelParallelConv2d
    from minidist.parallel.model.spatial_parallel import SpatialParallelConv2d

    depthwise = nn.Conv2d(4, 4, 3, padding=1, groups=4)
    for cls in (ChannelParallelConv2d, SpatialParallelConv2d):
        with pytest.raises(ValueError, match=f"{cls.__name__}.from_conv: conv has groups=4"):
            cls.from_conv(depthwise)
