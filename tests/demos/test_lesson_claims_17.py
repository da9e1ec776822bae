"""The claims lesson 17 (splitting a transformer) states in its text, held
on the formulas (the lesson asserts its own runs' numbers; the general
statements are held here for other shapes too), and the one count of a
block's activations that lessons 16, 17 and 18 share. Small: no lesson is
run whole, no process is started."""

from __future__ import annotations

import pytest

from minidist import memory
from minidist.models.gpt import GPTConfig
from minidist.parallel.mesh import choose_plan, plan_inputs
from minidist.parallel.tensor.costs import gpt_activation_bytes

P_KEY = "attention: probabilities P (B H T T)"
#: Section 1's GPT (and lesson 18's): 32 layers of width 4096, 32 heads, contexts of 4,096.
BIG = plan_inputs.GPTShape(n_layer=32, n_embd=4096, n_head=32, vocab_size=50304, seq_len=4096,
                           global_batch=1024, micro_batch=1)


def test_lessons_16_17_18_give_one_block_the_same_activation_bytes():
    """One count, one function: the block lesson 17 prints (section 1, and
    the planner of section 6) is the block of lesson 16's formula, and it is
    lesson 18's P plus the rest at T = 4,096."""
    terms = memory.transformer_block_activation_terms(1, 4096, 4096, 32, itemsize=2)
    p, rest = terms[P_KEY], sum(terms.values()) - terms[P_KEY]
    assert BIG.layer_activation_bytes(itemsize=2) == p + rest
    assert memory.transformer_block_activation_bytes(1, 4096, 4096, 32, itemsize=2) == p + rest
    for n in (2, 4, 8):
        for sequence_parallel in (False, True):
            assert BIG.layer_activation_bytes(n, sequence_parallel, itemsize=2) == \
                memory.transformer_block_activation_bytes(1, 4096, 4096, 32, 2, tp=n,
                                                          sequence_parallel=sequence_parallel)
    config = GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=8, n_embd=64)
    for n in (2, 4, 8):
        for sequence_parallel in (False, True):
            assert gpt_activation_bytes(config, 4, 32, n, 0, sequence_parallel).per_block == \
                memory.transformer_block_activation_bytes(4, 32, 64, 8, tp=n,
                                                          sequence_parallel=sequence_parallel)


@pytest.mark.parametrize("B,T,d,H", [(4, 32, 64, 8), (2, 48, 96, 12), (1, 4096, 4096, 32)])
@pytest.mark.parametrize("s", [2, 4])
def test_a_block_keeps_the_values_section_3_states(B, T, d, H, s):
    """Section 3: unsplit 25 B T d + 2 B T values and P's B H T^2; tensor
    parallel B T d (12 + 17/n) + 2 B T + B H T^2 / n (16/n once a rank holds
    one head); with sequence parallelism B T d (4 + 27/n) + 2 B T / n + B H
    T^2 / n (26/n with one head)."""
    btd, bt, p = B * T * d, B * T, B * H * T * T

    def count(n=1, sequence_parallel=False):
        return memory.transformer_block_activation_bytes(B, T, d, H, s, tp=n,
                                                         sequence_parallel=sequence_parallel)

    assert count() == s * (25 * btd + 2 * bt + p)
    for n in [n for n in (2, 3, 4, 8, 16, 32) if H % n == 0 and T % n == 0]:
        copy = 1 if H // n > 1 else 0
        assert count(n) * n == s * (12 * btd * n + (16 + copy) * btd + 2 * bt * n + p)
        assert count(n, True) * n == s * (4 * btd * n + (26 + copy) * btd + 2 * bt + p)
        assert count(n, True) < count(n) < count()


def test_the_split_stops_at_the_heads():
    """Section 3's picture stops at n = 8: more ranks than heads cannot split them."""
    memory.transformer_block_activation_bytes(4, 32, 64, 8, tp=8)
    with pytest.raises(ValueError, match="must divide the 8 heads"):
        memory.transformer_block_activation_bytes(4, 32, 64, 8, tp=16)


def test_splitting_divides_the_weights_by_n_and_only_part_of_the_activations():
    """Section 1: over n ranks the model states fall to about 1/n (the
    LayerNorms and the row layers' biases stay whole), the activations less;
    sequence parallelism cuts most of what stays; plain TP flattens out."""
    states = {n: BIG.block_parameters(n) for n in (1, 2, 4, 8)}
    plain = {n: BIG.layer_activation_bytes(n) for n in (1, 2, 4, 8)}
    sharded = {n: BIG.layer_activation_bytes(n, sequence_parallel=True) for n in (2, 4, 8)}
    for n in (2, 4, 8):
        assert 1 / n < states[n] / states[1] < 1.01 / n
        assert plain[n] / plain[1] > states[n] / states[1]
        assert sharded[n] < plain[n]
    assert plain[4] - plain[8] < plain[2] - plain[4]


def test_the_playbooks_plan_is_near_the_fastest_and_the_fastest_pipelines():
    """Section 6, with the one count of activations: the Playbook stops at
    tensor parallelism with no pipeline, among the good plans but not the
    fastest, which adds pipeline stages whose bubble costs less than what
    they save on the data-parallel gradient sum; dp alone does not fit."""
    comparison = choose_plan.compare_plans(BIG, 1024, memory_limit=80e9)
    playbook = choose_plan.playbook_plan(BIG, 1024, memory_limit=80e9).step
    best = comparison.best
    assert playbook.plan.pp == 1 and best.plan.pp > 1
    assert best.pp_bubble < playbook.dp_comm - best.dp_comm
    assert best.total < playbook.total < 1.2 * best.total
    assert comparison.too_big[-1].plan.dp == 1024


def test_the_step_byte_tables_have_column_headings():
    """Sections 2 and 3 print gpt_step_bytes' tables: each names its columns."""
    from minidist.parallel.tensor.costs import format_step_bytes, gpt_step_bytes

    config = GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=8, n_embd=64)
    for sequence_parallel in (False, True):
        table = gpt_step_bytes(config, 4, 32, 2, sequence_parallel=sequence_parallel)
        measured = {"forward": table.forward, "backward": table.backward}
        heading = format_step_bytes(table, measured).splitlines()[0].split()
        assert heading == ["pass", "collective,", "array", "calls", "bytes", "a", "rank",
                           "in", "the", "trace"]
        assert format_step_bytes(table).splitlines()[0].split()[-3:] == ["bytes", "a", "rank"]


def test_a_tensor_parallel_block_sends_two_ring_all_reduces_each_way():
    """Section 2's formula, written out: 2 all_reduces x 2 (n - 1)/n B T d s bytes."""
    from minidist.distributed.collectives.traffic import ring_all_reduce_sent

    B, T, d, s = 4, 32, 64, 4
    for n in (2, 4, 8):
        assert all(2 * s * sent == 2 * 2 * (n - 1) * B * T * d * s // n
                   for sent in ring_all_reduce_sent(B * T * d, n))
