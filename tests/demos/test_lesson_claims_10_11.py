"""The claims lessons 10 and 11 state in their text, held where a test can
hold them: on the byte formulas the lessons check their traces against, and
the halo plan (the lessons' measured step times are theirs to print; the
direction each comparison states is held here). Formulas only: fast."""

from __future__ import annotations

import pytest

from minidist.parallel.model.channel_parallel import channel_parallel_bytes
from minidist.parallel.model.costs import split_bytes
from minidist.parallel.model.hybrid import strategy_bytes
from minidist.parallel.model.spatial_parallel import halo_plan
from minidist.train import build_model

# -------------------------------------------------------------- lesson 10

LAYER_IN, LAYER_OUT = 1000, 500  # Dettmers' layer (lesson 10, section 2)


def test_lesson10_dettmers_layer_at_batch_128_splits_send_about_4_times_less():
    table = split_bytes(LAYER_IN, LAYER_OUT, 128, world_size=2)
    assert table["data_parallel"].payload == 500_000
    assert table["row"].payload == 128_000
    assert table["column"].payload == 160_000
    for split in ("row", "column"):
        assert max(table[split].bytes_per_rank) < min(table["data_parallel"].bytes_per_rank)


@pytest.mark.parametrize("split,crossing", [("row", 500), ("column", 400)])
def test_lesson10_data_parallel_becomes_cheaper_past_the_stated_batch(split, crossing):
    """'they cross data parallel's 500,000 at B = 500 and B = 400': below the
    crossing the split sends less, above it more."""
    def payload(name, batch):
        return split_bytes(LAYER_IN, LAYER_OUT, batch, 2)[name].payload

    assert payload(split, crossing) == payload("data_parallel", crossing)
    assert payload(split, crossing - 8) < payload("data_parallel", crossing - 8)
    assert payload(split, crossing + 8) > payload("data_parallel", crossing + 8)


def test_lesson10_stacking_each_layer_sends_a_quarter_more_than_megatrons_pair():
    """Section 4: the block 1000 -> 500 -> 1000 at batch 128 on 2 ranks; the
    pair sends 512,000 bytes a pass, stacking each layer 640,000."""
    paired = (split_bytes(LAYER_IN, LAYER_OUT, 128, 2)["column_split_output"].bytes_per_rank[0]
              + split_bytes(LAYER_OUT, LAYER_IN, 128, 2)["row_split_input"].bytes_per_rank[0])
    stacked = (split_bytes(LAYER_IN, LAYER_OUT, 128, 2)["column"].bytes_per_rank[0]
               + split_bytes(LAYER_OUT, LAYER_IN, 128, 2)["row"].bytes_per_rank[0])
    assert (paired, stacked) == (1_024_000, 1_280_000)
    assert stacked == paired * 5 // 4


def test_lesson10_the_cnn_hybrid_pays_at_batch_16_and_not_at_128():
    """Section 6: at batch 16 the hybrid and pure model parallel send less than
    data parallel (52,608 and 33,408 against 153,128 bytes), at 128 more
    (1.75x and 1.87x), and model parallel passes data parallel at batch 74."""
    def table(batch):
        return strategy_bytes(build_model("cnn"), (1, 8, 8), batch, 2)

    small, large = table(16), table(128)
    assert (small.bytes("data_parallel"), small.bytes("hybrid"),
            small.bytes("model_parallel")) == (153_128, 52_608, 33_408)
    assert small.bytes("model_parallel") < small.bytes("hybrid") < small.bytes("data_parallel")
    assert large.bytes("model_parallel") / large.bytes("data_parallel") == pytest.approx(1.75,
                                                                                         abs=0.01)
    assert large.bytes("hybrid") / large.bytes("data_parallel") == pytest.approx(1.87, abs=0.01)
    dp = small.bytes("data_parallel")  # the gradient's size: the same at every batch
    assert table(72).bytes("model_parallel") <= dp < table(74).bytes("model_parallel")


def test_lesson10_megatrons_defaults_send_less_not_half_each():
    """Section 3: gather_output=False and input_is_parallel=True send less
    still (128,000 and 64,000 values against 160,000 and 128,000): the row
    split's half, the column split's four fifths."""
    table = split_bytes(LAYER_IN, LAYER_OUT, 128, world_size=2)
    assert table["column_split_output"].payload == 128_000 < table["column"].payload
    assert table["row_split_input"].payload == 64_000 == table["row"].payload // 2
    assert table["column_split_output"].payload * 5 == table["column"].payload * 4


def test_lesson10_krizhevskys_wide_layer_favours_the_split_up_to_thousands():
    """Section 6: a 4096 x 4096 dense layer split on 2 ranks sends less than
    data parallel up to a batch in the thousands (2,731)."""
    def less(batch):
        table = split_bytes(4096, 4096, batch, 2)
        return table["row"].payload < table["data_parallel"].payload

    assert less(2730) and not less(2731)


def test_lesson10_convolutions_have_few_weights_per_activation_dense_layers_many():
    table = strategy_bytes(build_model("cnn"), (1, 8, 8), 64, 2)
    ratio = {layer.name: layer.weights / layer.activations for layer in table.layers}
    conv = [ratio[layer.name] for layer in table.layers if layer.kind == "conv"]
    dense = [ratio[layer.name] for layer in table.layers if layer.kind == "dense"]
    assert max(conv) < min(dense)


# -------------------------------------------------------------- lesson 11


def test_lesson11_the_halo_share_of_the_image_falls_as_one_over_h():
    """A 3x3 conv on 2 ranks moves 2 (P - 1) = 2 rows whatever the height: a
    share 2 / H of the image's rows, halved each time the image doubles."""
    shares = []
    for side in (32, 64, 128, 256, 512):
        moved = halo_plan(side, 3, 1, 1, 2).rows_moved()
        assert moved == 2
        shares.append(moved / side)
    assert shares == sorted(shares, reverse=True)
    assert all(a / b == 2 for a, b in zip(shares, shares[1:]))


def test_lesson11_the_halo_is_two_rows_per_inner_border():
    assert halo_plan(12, 3, 1, 1, 4).rows_moved() == 2 * (4 - 1)


@pytest.mark.parametrize("world", [2, 4])
def test_lesson11_the_channel_split_moves_about_the_activations_whatever_p(world):
    """(P - 1)/P of the output forward and 2 (P - 1)/P of the input backward:
    a share of the activations that grows with P, never falls."""
    batch, c_in, c_out, side = 8, 16, 32, 16
    forward, backward = channel_parallel_bytes(batch, c_in, c_out, side, side, side, side, world)
    output_bytes, input_bytes = batch * c_out * side * side * 4, batch * c_in * side * side * 4
    assert forward[0] == (world - 1) * output_bytes // world
    assert backward[0] == 2 * (world - 1) * input_bytes // world
    assert forward[0] + backward[0] >= output_bytes // 2 + input_bytes


def test_lesson11_local_batchnorm_gives_another_loss_from_the_first_step():
    """Section 3: 2 workers of 4 images, each normalising by its own shard,
    see another loss than one process on the 8 images, at the very first
    step (the same weights), by far more than float32 round-off."""
    import numpy as np

    from minidist import Tensor, nn
    from minidist.data import load_digits

    nn.init.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 4 * 4, 10))
    x, y = load_digits(flatten=False)[:2]
    rows = np.random.default_rng(0).permutation(len(x))[:8]
    loss = nn.CrossEntropyLoss()
    whole = float(loss(model(Tensor(x[rows])), y[rows]).data)
    shards = np.mean([float(loss(model(Tensor(x[part])), y[part]).data)
                      for part in (rows[:4], rows[4:])])
    assert abs(shards - whole) > 1e-4
