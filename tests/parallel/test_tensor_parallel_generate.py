"""Generation and bad inputs on the tensor-parallel GPT, as one process has them.

One launch per world size (2 and 3 ranks, shm, float64, a vocabulary of 11
words: uneven shares on both) runs every case inside the workers:

* ``generate`` on the shard, with and without a KV cache, with and without
  top_k: every rank draws the same tokens, and they are the tokens one
  process draws from the whole model with the same seed (the parent
  computes those);
* token ids past the vocabulary or negative, and targets past it or
  negative, given to every rank: each rank refuses them in the words of
  ``nn.Embedding`` and ``F.cross_entropy`` (``ignore_index`` still allowed);
  a KV cache on a sequence-parallel shard is refused too.

A second launch gives a bad token id to rank 1 only: the run ends with an
error whose first line names rank 1, not with a hang or a silent loss.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist.models import GPT, GPTConfig, generate
from minidist.models.kv_cache import KVCache
from minidist.parallel.tensor.gpt import tensor_parallel_gpt

CONFIG = GPTConfig(vocab_size=11, block_size=6, n_layer=2, n_head=6, n_embd=24)
WORLDS = [2, 3]
#: (prompt, new tokens, top_k): a prompt of 3 tokens grown past block_size
#: (the window slides and the cache starts again), and one of a whole block.
CASES = [((2, 3), 9, None), ((2, 3), 9, 3), ((1, 6), 4, None)]


def _model():
    return GPT(CONFIG, rng=0).to(np.float64)


def _prompt(shape):
    return np.random.default_rng(list(shape)).integers(0, CONFIG.vocab_size, shape)


def _draws(model):
    return {(case, cached): generate(model, _prompt(shape), new, top_k=top_k, seed=4,
                                     use_cache=cached)
            for case, (shape, new, top_k) in enumerate(CASES) for cached in (False, True)}


def _refusal(attempt):
    try:
        attempt()
    except (ValueError, TypeError, IndexError) as error:
        return f"{type(error).__name__}: {error}"
    return None


def _worker():
    shard = tensor_parallel_gpt(_model())
    good = _prompt((2, 4))
    far, negative, padded = good.copy(), good.copy(), good.copy()
    far[1, 2], negative[0, 1], padded[0, :2] = CONFIG.vocab_size, -3, -100
    refusals = dict(
        token_far=_refusal(lambda: shard(far)),
        token_negative=_refusal(lambda: shard(negative)),
        token_float=_refusal(lambda: shard(good.astype(np.float64))),
        target_far=_refusal(lambda: shard.loss(shard(good), far)),
        target_negative=_refusal(lambda: shard.loss(shard(good), negative)),
        sequence_cache=_refusal(lambda: tensor_parallel_gpt(_model(), sequence_parallel=True)(
            good, cache=KVCache(CONFIG.n_layer, CONFIG.block_size))),
    )
    ignored = shard.loss(shard(good), padded).item()   # ignore_index stays allowed
    return dict(draws=_draws(shard), refusals=refusals, ignored=ignored)


@pytest.fixture(scope="module")
def runs():
    return {world: minidist.launch(_worker, world_size=world, transport="shm", timeout=120)
            for world in WORLDS}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", WORLDS)
def test_every_rank_draws_the_tokens_one_process_draws(runs, world):
    whole = _draws(_model())
    for rank, result in enumerate(runs[world]):
        for key, tokens in whole.items():
            np.testing.assert_array_equal(result["draws"][key], tokens,
                                          err_msg=f"rank {rank}, case and cache {key}")
    # The draws vary: a sampler that always gave the same token would pass the rest.
    assert len(np.unique(whole[0, False][:, 3:])) > 2


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", WORLDS)
def test_bad_tokens_and_targets_are_refused_as_one_process_refuses_them(runs, world):
    vocab = CONFIG.vocab_size
    for rank, result in enumerate(runs[world]):
        said = result["refusals"]
        assert said["token_far"] == (
            f"IndexError: rank {rank}: VocabParallelEmbedding: token id {vocab} is out of range "
            f"for a vocabulary of {vocab} words (valid ids are 0..{vocab - 1}); check the "
            f"tokenizer's vocabulary size against the model's vocab_size={vocab}")
        assert said["token_negative"].startswith(f"IndexError: rank {rank}: VocabParallelEmbedding: "
                                                 "token id -3 is out of range")
        assert said["token_float"].startswith(f"TypeError: rank {rank}: VocabParallelEmbedding: "
                                              "token ids must be integers")
        assert said["target_far"].startswith(
            f"ValueError: rank {rank}: vocab_parallel_cross_entropy: target {vocab} is out of "
            f"range for the vocabulary (valid targets are 0..{vocab - 1}, and ignore_index=-100")
        assert said["target_negative"].startswith(
            f"ValueError: rank {rank}: vocab_parallel_cross_entropy: target -3 is out of range")
        assert "sequence parallelism cannot cut" in said["sequence_cache"]
        assert "use_cache=False" in said["sequence_cache"]
        assert np.isfinite(result["ignored"])
        for text in said.values():
            assert "\n" not in text


def _one_rank_gets_a_bad_token():
    shard = tensor_parallel_gpt(_model())
    idx = _prompt((2, 4))
    if dist.get_rank() == 1:
        idx[0, 0] = CONFIG.vocab_size + 5
    shard.loss(shard(idx), idx)


@pytest.mark.timeout(120)
def test_a_bad_token_on_one_rank_ends_the_run_naming_that_rank():
    with pytest.raises(dist.WorkerError) as caught:
        minidist.launch(_one_rank_gets_a_bad_token, world_size=2, transport="shm", timeout=60)
    first = str(caught.value).splitlines()[0]
    assert "rank 1 failed with IndexError" in first, first
    assert f"token id {CONFIG.vocab_size + 5} is out of range" in str(caught.value)
