"""The claims lesson 18 (long sequences) states in its text, held on the
formulas and on one process (the lesson asserts its own runs' numbers; the
general statements it makes are held here for other shapes too). Small: no
lesson is run whole."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from minidist import memory
from minidist.parallel.context.costs import ring_attention_bytes, ulysses_bytes
from minidist.parallel.context.ring_attention import merge
from minidist.parallel.context.split import block_work
from minidist.parallel.mesh import plan_inputs


def _softmax_attention(scores, values):
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (weights / weights.sum(axis=-1, keepdims=True)) @ values


def _block(scores, values):
    top = scores.max(axis=-1)
    weights = np.exp(scores - top[:, None])
    total = weights.sum(axis=-1)
    return (weights @ values) / total[:, None], top + np.log(total)


@pytest.mark.parametrize("cuts", [(3,), (1, 4), (2, 5, 7)])
def test_the_online_softmax_merge_is_exact_in_any_order(cuts):
    """Section 2: 'The merge is exact, not an approximation, and it does not
    care about the order of the blocks'."""
    rng = np.random.default_rng(len(cuts))
    scores, values = rng.normal(size=(3, 9)) * 4, rng.normal(size=(9, 2))
    whole = _softmax_attention(scores, values)
    blocks = [(scores[:, a:b], values[a:b]) for a, b in zip((0,) + cuts, cuts + (9,))]
    for order in itertools.permutations(range(len(blocks))):
        out, lse = _block(*blocks[order[0]])
        for index in order[1:]:
            merge(out, lse, *_block(*blocks[index]))
        np.testing.assert_allclose(out, whole, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(lse, np.logaddexp.reduce(scores, axis=-1), rtol=1e-12)


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_zigzag_keeps_every_rank_busy_and_contiguous_idles_rank_0(world):
    """Section 2: contiguous blocks leave rank 0 idle after its first step;
    the zig-zag gives every rank the same work at every step (T a multiple
    of 2n) and no more in total; 'Try': the contiguous busy share falls with n."""
    T = 4 * world
    zigzag = block_work(T, world, is_causal=True, layout="zigzag")
    contiguous = block_work(T, world, is_causal=True, layout="contiguous")
    assert (zigzag == zigzag[:, :1]).all()
    assert (contiguous[1:, 0] == 0).all()
    assert zigzag.sum() <= contiguous.sum()


def test_the_contiguous_busy_share_falls_with_the_ranks():
    def busy(world):
        table = block_work(8 * world, world, is_causal=True, layout="contiguous")
        return table.sum() / (world * table.max(axis=1).sum())
    shares = [busy(world) for world in (2, 4, 8, 16)]
    assert all(a > b for a, b in zip(shares, shares[1:]))


@pytest.mark.parametrize("world", [2, 4, 8, 16, 32])
def test_ring_bytes_stay_near_2bhtds_and_ulysses_fall_as_1_over_n(world):
    """Section 4: ring forward 2 (n-1)/n B H T D s, between B H T D s (n = 2)
    and 2 B H T D s, backward between 3 and 4 B H T D s; Ulysses 4 (n-1)/n^2
    B H T D s each way: 2/n of the ring's forward."""
    B, H, T, D, s = 1, 32, 64 * world, 8, 2
    bhtds = B * H * T * D * s
    ring = ring_attention_bytes(B, H, T, D, world, itemsize=s)
    ulysses = ulysses_bytes(B, H, T, D, world, itemsize=s)
    assert set(ring.forward) == {2 * (world - 1) * bhtds // world}
    assert bhtds <= ring.forward[0] < 2 * bhtds
    assert set(ulysses.forward) == set(ulysses.backward) == {4 * (world - 1) * bhtds // world ** 2}
    assert ring.forward[0] * 2 == world * ulysses.forward[0]
    # The backward, 2 (2n - 1)/n B H T D s: 3 B H T D s at n = 2, towards 4 B H T D s.
    assert set(ring.backward) == {2 * (2 * world - 1) * bhtds // world}
    assert 3 * bhtds <= ring.backward[0] < 4 * bhtds
    assert (ring.backward[0] == 3 * bhtds) == (world == 2)
    # Both passes, all ranks: ring / Ulysses = n (3n - 2) / (4 (n - 1)) (2.0 at n = 2).
    both = (sum(ring.forward) + sum(ring.backward)) / (sum(ulysses.forward) + sum(ulysses.backward))
    assert both == pytest.approx(world * (3 * world - 2) / (4 * (world - 1)))


def test_ulysses_stops_at_the_heads():
    """'Try': with heads=8 Ulysses stops at 8 ranks."""
    ulysses_bytes(1, 8, 128, 8, 8, itemsize=2)
    with pytest.raises(ValueError, match="not divisible"):
        ulysses_bytes(1, 8, 128, 8, 16, itemsize=2)


@pytest.mark.parametrize("link", ["intra", "inter"])
def test_a_ring_step_hides_its_message_from_a_block_of_f_s_beta_positions(link):
    """Section 4: a ring step's arithmetic (causal, zig-zag: 2 B H T^2 D / n^2
    flops) outlasts its message (2 B H (T/n) D s bytes, beta alone) exactly
    when T/n >= (FLOP/s) s beta; a shorter context stops hiding at fewer ranks."""
    machine = plan_inputs.CLUSTER
    beta = getattr(machine, link).beta
    B, H, D, s = 1, 32, 128, 2
    threshold = machine.flops * s * beta

    def hides(T, n):
        compute = 2 * B * H * T * T * D / n ** 2 / machine.flops
        return compute >= 2 * B * H * (T / n) * D * s * beta

    for T in (32768, 131072):
        for n in (2, 4, 8, 16, 32, 64):
            assert hides(T, n) == (T / n >= threshold * (1 - 1e-12)), (T, n)
    largest = {T: max([n for n in (1, 2, 4, 8, 16, 32, 64) if hides(T, n)], default=0)
               for T in (16384, 131072)}
    assert largest[16384] <= largest[131072]


P_KEY = "attention: probabilities P (B H T T)"


def test_p_and_the_rest_of_a_block_are_lesson_17s_block():
    """Section 1: one block of lesson 17's GPT at T = 4,096, split into P
    and the rest, sums to the block lesson 17 prints (the planner's count
    too): one function, one count. P is B H T^2 values of s bytes."""
    shape = plan_inputs.GPTShape(n_layer=32, n_embd=4096, n_head=32, vocab_size=50304,
                                 seq_len=4096, global_batch=1, micro_batch=1)
    terms = memory.transformer_block_activation_terms(1, 4096, 4096, 32, itemsize=2)
    assert terms[P_KEY] == 32 * 4096 * 4096 * 2
    assert sum(terms.values()) == shape.layer_activation_bytes(itemsize=2)


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_context_parallelism_divides_the_rest_of_a_block_by_n(n):
    """Section 1: cut the sequence over n ranks and every term but P, linear
    in T, is divided by n; at 128k P alone is more than a terabyte a block,
    and the rest of 32 blocks needs more than one rank of 80 GB."""
    T = 131072

    def rest(length):
        terms = memory.transformer_block_activation_terms(1, length, 4096, 32, itemsize=2)
        return sum(terms.values()) - terms[P_KEY], terms[P_KEY]

    whole, p = rest(T)
    assert n * rest(T // n)[0] == whole
    assert p > 1e12 and 32 * whole > 80e9
