"""What lesson 17's prose says of the values it glued."""

import math


def check(glued):
    value = {name: entry["value"] for name, entry in glued.items()}
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
