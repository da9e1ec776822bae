"""all_to_all_single with split sizes and all_to_all with lists of different
sizes, as expert parallelism calls them: each rank sends a different number
of rows to each rank, zero included.

One launch per (transport, world size) runs every split pattern inside the
workers; the parent builds the expected output of every rank with NumPy from
the same seeded pattern (rows sent by rank i to rank j: ``counts[i, j]``).
A second launch checks that a wrong ``output_split_sizes`` is refused with a
message-size error, not answered with shifted rows.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist

PATTERNS = 6
WIDE = 4096  # floats per row in the large pattern: pieces of up to 640 KiB, past the slots


def counts_of(pattern: int, n: int) -> np.ndarray:
    """``counts[i, j]``: rows rank i sends to rank j, the same on every rank.

    Pattern 0 is all equal (split sizes given anyway); 1 has rank 0 send
    nothing at all and the last rank receive nothing; the others are random
    with about a third zeros."""
    if pattern == 0:
        return np.full((n, n), 2)
    rng = np.random.default_rng([pattern, n])
    counts = rng.integers(0, 5, (n, n)) * (rng.random((n, n)) > 0.33)
    if pattern == 1:
        counts[0, :] = 0
        counts[:, n - 1] = 0
    return counts


def row_width(pattern: int) -> int:
    return WIDE if pattern == PATTERNS - 1 else 3


def input_of(pattern: int, rank: int, n: int) -> np.ndarray:
    """Rank ``rank``'s rows: each says who sent it, to whom, and which it was."""
    counts = counts_of(pattern, n)
    width = row_width(pattern)
    rows = []
    for to in range(n):
        for index in range(counts[rank, to]):
            rows.append(np.full(width, rank * 10_000 + to * 100 + index, np.float32)
                        + np.arange(width, dtype=np.float32) / 8)
    return np.array(rows, np.float32).reshape(-1, width)


def expected_output(pattern: int, rank: int, n: int) -> np.ndarray:
    """What rank ``rank`` must hold: the rows every rank i sent it, in rank order."""
    width = row_width(pattern)
    parts = []
    for source in range(n):
        counts = counts_of(pattern, n)
        start = counts[source, :rank].sum()
        parts.append(input_of(pattern, source, n)[start:start + counts[source, rank]])
    return np.concatenate(parts).reshape(-1, width)


def _exchanges():
    rank, n = dist.get_rank(), dist.get_world_size()
    out = {}
    for pattern in range(PATTERNS):
        counts = counts_of(pattern, n)
        source = input_of(pattern, rank, n)
        send, receive = counts[rank].tolist(), counts[:, rank].tolist()
        output = np.full((sum(receive), row_width(pattern)), -1, np.float32)
        dist.all_to_all_single(output, source, output_split_sizes=receive,
                               input_split_sizes=send)
        out["single", pattern] = output
        # Positional, as torch scripts often pass them, and non-blocking.
        output = np.full((sum(receive), row_width(pattern)), -1, np.float32)
        work = dist.all_to_all_single(output, source, receive, send, async_op=True)
        while not work.is_completed():
            pass
        out["single async", pattern] = (work.wait(), output)
        # The list form: one array per rank, of that rank's rows.
        pieces = np.split(source, np.cumsum(send)[:-1])
        outputs = [np.full((count, row_width(pattern)), -1, np.float32) for count in receive]
        dist.all_to_all(outputs, pieces)
        out["list", pattern] = np.concatenate(outputs)
        if pattern == 0:  # equal pieces: bruck may run them, split sizes or not
            output = np.zeros_like(source)
            dist.all_to_all_single(output, source, receive, send, algorithm="bruck")
            out["equal splits bruck"] = output
    # Only the output's splits given: the input is cut in n equal parts (torch).
    mine = np.arange(2 * n, dtype=np.int64) + 100 * rank
    got = np.zeros(2 * n, np.int64)
    dist.all_to_all_single(got, mine, output_split_sizes=[2] * n)
    out["output splits only"] = got
    return out


@pytest.mark.parametrize("transport", ["pipe", "shm"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_uneven_all_to_all_against_numpy(transport, world_size):
    n = world_size
    results = minidist.launch(_exchanges, world_size=n, transport=transport, timeout=60)
    assert any((counts_of(p, n) == 0).any() for p in range(1, PATTERNS))  # zeros were sent
    for rank, out in enumerate(results):
        for pattern in range(PATTERNS):
            expected = expected_output(pattern, rank, n)
            np.testing.assert_array_equal(out["single", pattern], expected)
            done, output = out["single async", pattern]
            assert done is True
            np.testing.assert_array_equal(output, expected)
            np.testing.assert_array_equal(out["list", pattern], expected)
        np.testing.assert_array_equal(out["equal splits bruck"], expected_output(0, rank, n))
        np.testing.assert_array_equal(out["output splits only"],
                                      np.concatenate([np.arange(2 * rank, 2 * rank + 2)
                                                      + 100 * i for i in range(n)]))


def test_expected_output_is_a_transpose_of_the_counts():
    """The reference itself: the rows rank r holds are counts[:, r]."""
    for pattern in range(PATTERNS):
        counts = counts_of(pattern, 3)
        for rank in range(3):
            assert len(expected_output(pattern, rank, 3)) == counts[:, rank].sum()
            assert len(input_of(pattern, rank, 3)) == counts[rank].sum()


def _wrong_output_split():
    rank = dist.get_rank()
    source = np.arange(6, dtype=np.float32).reshape(3, 2)
    # Rank 0 sends 1 row to rank 1, but rank 1 says it expects 2 from rank 0.
    send = [2, 1] if rank == 0 else [1, 2]
    receive = [2, 1] if rank == 0 else [2, 2]
    output = np.zeros((sum(receive), 2), np.float32)
    dist.all_to_all_single(output, source, receive, send)


def test_output_split_sizes_that_do_not_match_the_sender_are_refused():
    """Two ranks that disagree on one piece: a tie, so the lower rank's sizes
    are taken as right (the majority rule's), and the piece's sizes are said."""
    with pytest.raises(dist.WorkerError) as caught:
        minidist.launch(_wrong_output_split, world_size=2, transport="shm", timeout=60)
    error = caught.value
    first = str(error).splitlines()[0]
    assert (error.rank, error.kind) == (1, "mismatch"), first
    assert first.startswith(
        "rank 1 is the odd rank in call 0 of the world: its all_to_all_single expects 4 "
        "elements from rank 0, which sends 2 (a tie: the lower rank's sizes are taken as "
        "right). Rank i's input_split_sizes[j] must be rank j's output_split_sizes[i]"), first
    assert "shape (2,)" in error.remote_message and "shape (4,)" in error.remote_message


def _local_errors():
    n = dist.get_world_size()
    x = np.zeros((4, 2), np.float32)
    messages = {}
    for name, call in {
        "self piece": lambda: dist.all_to_all_single(
            np.zeros((4, 2), np.float32), x, [1, 3], [3, 1]),
        "row shape": lambda: dist.all_to_all_single(np.zeros((4, 3), np.float32), x,
                                                    [2, 2], [2, 2]),
        "negative": lambda: dist.all_to_all_single(np.zeros((4, 2), np.float32), x,
                                                   [2, 2], [5, -1]),
        "list dtype": lambda: dist.all_to_all([np.zeros(1, np.float64)] * n,
                                              [np.zeros(1, np.float32)] * n),
        "float input": lambda: dist.all_to_all_single(np.zeros((4, 2), np.float32), x,
                                                      input_split_sizes=[2, 2.0]),
        "float output": lambda: dist.all_to_all_single(np.zeros((4, 2), np.float32), x,
                                                       output_split_sizes=np.array([1.5, 2.5])),
    }.items():
        try:
            call()
            messages[name] = "no error"
        except ValueError as error:
            messages[name] = str(error)
    return messages


def test_errors_a_rank_finds_alone():
    for rank, messages in enumerate(minidist.launch(_local_errors, world_size=2,
                                                    transport="pipe", timeout=60)):
        sent, received = (3, 1) if rank == 0 else (1, 3)
        assert (f"input_split_sizes[{rank}] = {sent} rows and output_split_sizes[{rank}] = "
                f"{received}") in messages["self piece"]
        assert "one row shape" in messages["row shape"]
        assert "input_split_sizes[1] is -1, but split sizes are non-negative ints" in \
            messages["negative"]
        assert ("input_split_sizes[1] is 2.0, but split sizes are non-negative ints, whole "
                "numbers of rows") in messages["float input"]
        assert "output_split_sizes[0] is " in messages["float output"]
        assert "1.5" in messages["float output"]
        assert "input_tensor_list[0]'s float32" in messages["list dtype"]
        for text in messages.values():
            assert text.startswith(f"rank {rank}: "), text
