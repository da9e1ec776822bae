"""Lesson 6: what its prose chose to say of the run's numbers holds for them."""


def value(glued, name):
    return glued[name]["value"]


def check(glued):
    assert value(glued, "rate_1024_vs_16") > 1 and value(glued, "rate_1024_vs_1") > 1
    assert (value(glued, "ddp_verdict") == "agree to float32 rounding") == \
        (value(glued, "ddp_gap") < 1e-4)
    # constant rate: "from ... at batch 16 to ... at the full batch", undertrained
    assert value(glued, "constant_full") < value(glued, "constant_small")
    assert (value(glued, "constant_loss_verdict") == "hardly below") == \
        (value(glued, "constant_full_loss") > 2.0)
    assert value(glued, "updates_full") < value(glued, "updates_small")
    assert value(glued, "linear_full_lr") > 0.01
    drop, spread = value(glued, "linear_drop"), value(glued, "linear_spread")
    verdict = value(glued, "linear_spread_verdict")
    if "within the seed-to-seed spread" in verdict:
        assert drop <= spread
    if "about the seed-to-seed spread" in verdict:
        assert spread < drop <= 2 * spread
    breaks = value(glued, "linear_full") < value(glued, "linear_1024") - 1
    assert (value(glued, "breaks_verdict") == "It breaks at the end.") == breaks
    assert ("breaks down" in value(glued, "hot_verdict")) == \
        (value(glued, "hot_accuracy") < value(glued, "linear_1024") - 10)
    costs = value(glued, "warm_full") < value(glued, "linear_full")
    assert (value(glued, "warm_verdict") == "costs accuracy") == costs
    assert (value(glued, "lars_verdict") == "far better than") == \
        (value(glued, "lars_full") > value(glued, "constant_full") + 20)
    assert 0 <= value(glued, "lars_below") <= value(glued, "sizes_count")
    assert value(glued, "ratio_spread_least") <= value(glued, "ratio_spread_most") < 100
    # batch growth
    lower = round(value(glued, "final_decay_lr"), 1) - round(value(glued, "final_no_decay"), 1)
    assert abs(lower - value(glued, "no_decay_lower")) < 1e-9
    assert (value(glued, "decay_verdict") == "The decay is needed.") == (lower > 0.5)
    assert (value(glued, "growth_verdict") == "Growing the batch nearly replaces it.") == \
        (value(glued, "growth_gap_end") < 1)
    assert value(glued, "updates_grow_batch") < value(glued, "updates_decay_lr")
    assert abs(value(glued, "update_share") + value(glued, "fewer_syncs") - 1) < 1e-9
    between = (value(glued, "updates_grow_batch") < value(glued, "updates_hybrid")
               < value(glued, "updates_decay_lr"))
    assert (value(glued, "hybrid_verdict") == "lands in between in updates") == between
    # gaps are the differences of the printed (rounded) accuracies
    gap = round(value(glued, "final_decay_lr"), 1) - round(value(glued, "final_grow_batch"), 1)
    assert abs(value(glued, "growth_gap_end") - gap) < 1e-9
    # "drops ... as far or further": batch growth's noise scale ends no higher
    assert value(glued, "noise_grow_last") <= value(glued, "noise_decay_last")
    assert value(glued, "noise_factor_grow") >= value(glued, "noise_factor_decay")
    # one seed: no spread is spoken of
    if value(glued, "seeds") == 1:
        assert value(glued, "linear_full_spread") == ""
        assert "spread" not in value(glued, "growth_noise_text") or \
            "no spread" in value(glued, "growth_noise_text")
    assert value(glued, "lars_below") + value(glued, "lars_level") <= value(glued, "sizes_count")
