"""What lesson 17's prose says of the values it glued."""

import math


def check(glued):
    value = {name: entry["value"] for name, entry in glued.items()}
    text = {name: entry["text"] for name, entry in glued.items()}
    # Section 1: one block's activations are P and the rest; the model does not fit.
    assert math.isclose(value["block_activations_gb"],
                        value["block_p_gb"] + value["block_rest_gb"], rel_tol=1e-9)
    assert value["whole_model_ranks"] > 1
    # Splitting over 8 ranks divides the weights by 8 but only part of the
    # activations; sequence parallelism cuts most of what stays.
    assert 1 / 8 < value["states_8"] < 1.01 / 8   # the LayerNorms and some biases stay whole
    assert value["plain_8"] > value["states_8"]
    assert value["sharded_8"] < value["plain_8"]
    assert value["sharded_8"] < 1 - value["plain_8"]   # "cuts most of those"
    # Section 2: the heads each rank holds.
    assert value["heads_per_rank"] * 2 == 8
    assert value["rows_per_block"] == 64 // 2
    # Section 3: plain TP flattens out, TP + SP shrinks with n; the verdicts.
    first, second = value["tp_drops"]
    assert second < first
    shares = value["sp_kept"]
    assert shares[0] > shares[1] > shares[2]
    assert (value["tp_kept_8"] > 0.5) == (glued["tp_kept_8_verdict"]["text"] == "more than half")
    assert (value["sp_kept_8"] < 1 / 3) == \
        (glued["sp_kept_8_verdict"]["text"] == "less than a third")
    assert value["tp_kept_4"] > value["tp_kept_8"]
    # Section 3: one block's bytes at n = 2 are the text's formulas with the
    # run's sizes (B = 4, T = 32, d = 64, H = 8, s = 4), P / n in both.
    B, T, d, H, n, s = 4, 32, 64, 8, 2, 4
    assert value["tp_block_2"] == s * (B * T * d * (12 + 17 / n) + 2 * B * T + B * H * T * T / n)
    assert value["sp_block_2"] == s * (B * T * d * (4 + 27 / n) + 2 * B * T / n + B * H * T * T / n)
    # The form the run was in is the one the opening says.
    assert text["lesson_form"].startswith(
        "This is the lesson's **quick form**" if value["quick_form"] else
        "This is the lesson's **full form**")
