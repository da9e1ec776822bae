"""Ranks whose collective calls disagree: the odd rank is named, the same one every run.

Each case makes rank 1 of four differ from ranks 0, 2 and 3 in what it
calls, not in an argument agreed beforehand: only rank 1 passes split sizes
to all_to_all_single (the pairwise exchange where the others take Bruck's),
rank 1 skips one all_reduce of the tensor-parallel GPT, its MoE
has other expert counts, it shards the tensor-parallel GPT over the world
where the others use mesh["tp"], its context-parallel GPT another sequence
length, its GPT3D other micro-batches. Which
rank notices first is chance (the rank that receives the odd message, or
sleeps next to the odd call); the noticing rank reads the group's status
records and names the rank whose call differs from the majority's, so the
launcher names rank 1, kind "mismatch", with the same first line every run.

Some calls rightly differ from rank to rank, and a rank whose arguments do
not fit the others' shows it only as a piece that does not fit a receive,
seen by one receiver or another: rank 1's split sizes disagree with ranks 0
and 3's, rank 1 calls Ulysses attention or raw ring attention with another
sequence length. Each rank shows its call's shape in its record as it
enters the call (no message more), and the receiver judges them: the rank
in the most disagreeing pairs of split sizes, the rank whose shape differs
from the majority's.

A mismatched call leaves the group's ranks in different calls, some asleep
for good: no rank can catch the error and go on. So each run is a launch of
its own, three per case and transport (a launch takes a fraction of a
second).
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist.runtime.errors import WorkerError

TRANSPORTS = ["pipe", "shm"]
REPEATS = 3


def _only_rank_1_passes_split_sizes():
    sizes = dict(output_split_sizes=[2, 2, 2, 2], input_split_sizes=[2, 2, 2, 2])
    dist.all_to_all_single(np.zeros(8, np.float32), np.ones(8, np.float32),
                           **(sizes if dist.get_rank() == 1 else {}))


def _tensor_parallel_gpt(group=None):
    from minidist.models.gpt import GPT, GPTConfig
    from minidist.parallel.tensor.gpt import tensor_parallel_gpt

    config = GPTConfig(vocab_size=12, block_size=8, n_layer=1, n_head=4, n_embd=16)
    shard = tensor_parallel_gpt(GPT(config, rng=0), group)
    idx = np.random.default_rng(0).integers(0, 12, (2, 8))
    shard.loss(shard(idx), idx).backward()


def _rank_1_skips_an_all_reduce():
    from minidist.parallel.tensor import regions

    if dist.get_rank() == 1:
        real, calls = regions._all_reduce_sum, []

        def skipping_the_second(array, group, algorithm):
            calls.append(1)
            return array.copy() if len(calls) == 2 else real(array, group, algorithm)

        regions._all_reduce_sum = skipping_the_second
    _tensor_parallel_gpt()


def _rank_1_shards_over_the_world():
    mesh = dist.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    _tensor_parallel_gpt(None if dist.get_rank() == 1 else mesh["tp"])


def _rank_1_has_other_experts():
    from minidist.models.moe import MoEGPT, MoEGPTConfig
    from minidist.parallel.expert.dispatch import expert_parallel_gpt

    config = MoEGPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8,
                          n_expert=8 if dist.get_rank() == 1 else 4, top_k=2,
                          capacity_factor=1.0, aux_loss_coef=0.01)
    model = expert_parallel_gpt(MoEGPT(config, rng=0))
    idx = np.random.default_rng(0).integers(0, 11, (2, 8))
    model.loss(model(idx), idx).backward()


def _length():
    return 13 if dist.get_rank() == 1 else 16


def _rank_1_has_another_context_length():
    from minidist.models.gpt import GPT, GPTConfig
    from minidist.parallel.context.gpt import context_parallel_gpt

    config = GPTConfig(vocab_size=13, block_size=16, n_layer=1, n_head=4, n_embd=16)
    shard = context_parallel_gpt(GPT(config, rng=0))
    idx = np.random.default_rng(0).integers(0, 13, (2, _length()))
    shard.loss(shard(shard.shard(idx), _length()), shard.shard(idx), _length()).backward()


def _rank_1_has_other_micro_batches():
    from minidist.models.gpt import GPT, GPTConfig
    from minidist.parallel.mesh import GPT3D

    config = GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8)
    mesh = dist.init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=("pp", "dp", "tp"))
    GPT3D(GPT(config), mesh, "1f1b", microbatches=4 if dist.get_rank() == 1 else 2)


def _rank_1_sends_other_split_sizes():
    # 3 elements to rank 0 and 1 to rank 3, which both expect 2.
    send = [3, 2, 2, 1] if dist.get_rank() == 1 else [2, 2, 2, 2]
    dist.all_to_all_single(np.zeros(8, np.float32), np.ones(8, np.float32),
                           output_split_sizes=[2, 2, 2, 2], input_split_sizes=send)


def _attention_inputs():
    """This rank's (1, 4, L_r, 2) positions of a sequence of _length()."""
    from minidist.parallel.context.split import shard_sequence

    whole = np.random.default_rng(0).normal(size=(1, 4, _length(), 2))
    return shard_sequence(whole, _length(), dist.get_world_size(), dist.get_rank(), axis=2)


def _rank_1_calls_ulysses_with_another_length():
    from minidist.parallel.context import ulysses_attention

    x = _attention_inputs()
    ulysses_attention(x, x, x, _length())


def _rank_1_calls_ring_attention_with_another_length():
    from minidist.parallel.context import ring_attention

    x = _attention_inputs()
    ring_attention(x, x, x, _length(), is_causal=True)


#: case -> (what rank 1 does, how the first line begins)
CASES = {
    "split sizes on one rank": (
        _only_rank_1_passes_split_sizes,
        "rank 1 is the odd rank in call 0 of the world: all_to_all (pairwise, float32) on "
        "rank 1; all_to_all (bruck, float32) on ranks 0, 2 and 3 (most ranks)"),
    "a skipped all_reduce": (
        _rank_1_skips_an_all_reduce,
        "rank 1 is the odd rank in call 2 of the world: all_reduce (ring, MAX, float32) on "
        "rank 1; all_reduce (ring, SUM, float32) on ranks 0, 2 and 3 (most ranks)"),
    "the world for mesh['tp']": (
        _rank_1_shards_over_the_world,
        "rank 1 is the odd rank in call 0 of the world: all_reduce (ring, SUM, float32) on "
        "rank 1; ranks 2 and 3 returned from their function after 0 collective calls in the "
        "world, without making it (most ranks)"),
    "other expert counts": (
        _rank_1_has_other_experts,
        "rank 1 is the odd rank in call 0 of the world: all_to_all (pairwise, int64) with a "
        "different element count or root on rank 1; all_to_all (pairwise, int64) on ranks 0, "
        "2 and 3 (most ranks)"),
    "a context-parallel length": (
        _rank_1_has_another_context_length,
        "rank 1 called ContextParallelGPT.forward with seq_len 13, 2 sequences where ranks 0, "
        "2 and 3 call it with seq_len 16, 2 sequences"),
    "micro-batches": (
        _rank_1_has_other_micro_batches,
        "rank 1 called GPT3D with schedule '1f1b', 4 micro-batches"),
    "split sizes that disagree": (
        _rank_1_sends_other_split_sizes,
        "rank 1 is the odd rank in call 0 of the world: its all_to_all_single sends 3 "
        "elements to rank 0, which expects 2; sends 1 element to rank 3, which expects 2. "
        "Rank i's input_split_sizes[j] must be rank j's output_split_sizes[i]"),
    "a Ulysses length": (
        _rank_1_calls_ulysses_with_another_length,
        "rank 1 is the odd rank in call 0 of the world: its all_to_all_single sends 6 "
        "elements to rank 0, which expects 8; expects 6 elements from rank 0, which sends 8"),
    "a ring attention length": (
        _rank_1_calls_ring_attention_with_another_length,
        "rank 1 called ring_attention with seq_len 13, batch 1, 4 heads of width 2, causal, "
        "zigzag split where ranks 0, 2 and 3 call it with seq_len 16, batch 1, 4 heads of "
        "width 2, causal, zigzag split. Every rank must call ring_attention with the same "
        "arguments."),
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("case", list(CASES))
def test_the_launcher_names_the_rank_whose_call_differs_every_time(case, transport):
    function, expected = CASES[case]
    for _ in range(REPEATS):
        with pytest.raises(WorkerError) as caught:
            minidist.launch(function, world_size=4, transport=transport, timeout=60)
        first = str(caught.value).splitlines()[0]
        assert (caught.value.rank, caught.value.kind) == (1, "mismatch"), first
        assert first.startswith(expected), first


def test_the_records_name_the_majority_and_wait_for_ranks_on_their_way():
    """One rank's view of the group's status records: rank 2 still computing
    is waited for; then the call most ranks are in is the reference."""
    from minidist.distributed.collectives.call import ALGORITHMS
    from minidist.distributed.collectives.fingerprints import CallRecord, fingerprint
    from minidist.runtime import control as ctl

    ours = fingerprint("all_reduce", 0, dist.ReduceOp.SUM, np.float32, 10, 0, 0)
    other = fingerprint("broadcast", 0, None, np.float32, 10, 0, 0)
    block = ctl.ControlBlock.local(4)
    try:
        calls = CallRecord(ALGORITHMS, ranks=(0, 1, 2, 3), context=5)
        calls.seq = 1
        calls.record(0, ours, 10)
        block.set_waiting(3, ctl.OP_RECV, 0, ours, 5, 0, 1)
        block.set_running(2, 1)  # on its way: the verdict waits for it ...
        calls.VERDICT_SECONDS = 0.05
        assert calls.verdict(block, 0, ours, {1: other}) is None  # ... and gives up, unsure
        block.set_waiting(2, ctl.OP_RECV, 1, ours, 5, 0, 1)
        odd, line = calls.verdict(block, 0, ours, {1: other})
        assert odd == [1]
        assert line.startswith("rank 1 is the odd rank in call 0 of the world: broadcast (")
        assert line.endswith("all_reduce (coordinator, SUM, float32) on ranks 0, 2 and 3 (most ranks)")
        # Seen from the odd rank itself: the same verdict.
        assert calls.verdict(block, 1, other, {0: ours})[0] == [1]
    finally:
        block.close()


def test_split_sizes_name_the_rank_in_the_most_disagreeing_pairs():
    """The pair rule against cases worked by hand (group ranks; sends[i][j]
    what rank i sends to j, receives[j][i] what rank j expects from i)."""
    from minidist.distributed.collectives.split_sizes import odd_ranks

    even = [2, 2, 2, 2]
    # Rank 1 sends 3 to rank 0 and 1 to rank 3: in both disagreeing pairs.
    sends = {0: even, 1: [3, 2, 2, 1], 2: even, 3: even}
    receives = {rank: even for rank in range(4)}
    assert odd_ranks(sends, receives) == [(1, [(1, 0), (1, 3)], False)]
    # Ranks 1 and 3 both wrong, towards everyone: both named, 3 first
    # (it is in as many pairs as rank 1, and the higher).
    wrong = [5, 1, 1, 1]
    sends = {0: even, 1: wrong, 2: even, 3: wrong}
    named = odd_ranks(sends, receives)
    assert [rank for rank, _, _ in named] == [3, 1]
    assert named[0] == (3, [(3, 0), (3, 1), (1, 3), (3, 2)], True)
    assert named[1] == (1, [(1, 0), (1, 2)], False)  # what is left once rank 3 is named
    # One pair of two ranks: a tie, the lower rank's sizes taken as right.
    assert odd_ranks({0: [2, 1], 1: [1, 2]}, {0: [2, 1], 1: [2, 2]}) == [(1, [(0, 1)], True)]
    # Sizes that fit, however uneven: no one.
    assert odd_ranks({0: [1, 4], 1: [0, 7]}, {0: [1, 0], 1: [4, 7]}) == []
    # Only the ranks that showed their sizes are judged.
    assert odd_ranks({0: [2, 5, 2], 2: [2, 2, 2]}, {0: even[:3], 2: even[:3]}) == []


def test_a_shown_call_is_read_under_its_key_and_waited_for():
    """The shown-call records: written and read back whole, one per rank;
    the reading waits for a member on its way, and takes a member that
    shows a later call, or finished, as not coming."""
    from minidist.distributed import shown_calls
    from minidist.runtime import control as ctl

    block = ctl.ControlBlock.local(4)
    try:
        assert block.shown_call(0) is None  # nothing shown yet
        assert block.show_call(0, 7, 3, (1, 2, 3))
        assert block.shown_call(0) == (7, 3, (1, 2, 3))
        assert not block.show_call(1, 7, 3, range(ctl.SHOWN_VALUES + 1))  # no room
        assert block.shown_call(1) is None
        block.show_call(1, 7, 3, (1, 2, 4))
        block.show_call(2, 7, 4, (9,))       # went on to the next call
        block.set_running(3, 1)              # on its way ...
        shown, settled = shown_calls.read_shown(block, range(4), 7, 3, 0.05)
        assert (shown, settled) == ({0: (1, 2, 3), 1: (1, 2, 4)}, False)  # ... waited for
        block.set_state(3, ctl.FINISHED)
        shown, settled = shown_calls.read_shown(block, range(4), 7, 3, 0.05)
        assert (shown, settled) == ({0: (1, 2, 3), 1: (1, 2, 4)}, True)
        # Another context's call of the same number is not this one.
        assert shown_calls.read_shown(block, [0], 8, 3, 0.0) == ({}, False)
    finally:
        block.close()


#: The same mistakes as scripts of `minidist run` (each rank a script's
#: process, its error reported through a file): the first line of the
#: launcher's report, "minidist run: " and then the verdict.
SCRIPTS = {
    "split sizes that disagree": ("""
        send = [3, 2, 2, 1] if rank == 1 else [2, 2, 2, 2]
        dist.all_to_all_single(np.zeros(8, np.float32), np.ones(8, np.float32),
                               output_split_sizes=[2, 2, 2, 2], input_split_sizes=send)
        """, CASES["split sizes that disagree"][1]),
    "a ring attention length": ("""
        from minidist.parallel.context import ring_attention
        from minidist.parallel.context.split import shard_sequence

        length = 13 if rank == 1 else 16
        x = shard_sequence(np.random.default_rng(0).normal(size=(1, 4, length, 2)), length, 4,
                           rank, axis=2)
        ring_attention(x, x, x, length, is_causal=True)
        """, CASES["a ring attention length"][1]),
    "another reduction": ("""
        x = np.ones(1000, np.float32)
        for step in range(4):
            odd = rank == 1 and step == 2
            dist.all_reduce(x, op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM,
                            algorithm="ring")
        """, "rank 1 is the odd rank in call 2 of the world: all_reduce (ring, MAX, float32) on "
             "rank 1; all_reduce (ring, SUM, float32) on ranks 0, 2 and 3 (most ranks)"),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("case", list(SCRIPTS))
def test_minidist_run_names_the_rank_whose_call_differs_every_time(case, transport, tmp_path):
    """A rank of `minidist run` that raised a mismatch named the rank that
    noticed it ("rank 3 failed with CollectiveMismatchError: rank 1 is the
    odd rank ..."), whichever that was; now the odd rank, as launch does."""
    import os
    import subprocess
    import sys
    import textwrap

    from tests.runtime.test_forking_rank import ROOT

    body, expected = SCRIPTS[case]
    script = tmp_path / "script.py"
    script.write_text("import numpy as np\nimport minidist.distributed as dist\n\n"
                      "dist.init_process_group(timeout=60)\nrank = dist.get_rank()\n"
                      + textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=ROOT)
    for _ in range(REPEATS):
        run = subprocess.run([sys.executable, "-m", "minidist.cli", "run", "-n", "4",
                              "--transport", transport, str(script)], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
        first = next((line for line in run.stderr.splitlines()
                      if line.startswith("minidist run:")), "")
        assert run.returncode == 1, run.stderr
        assert first.startswith(f"minidist run: {expected}"), run.stderr
