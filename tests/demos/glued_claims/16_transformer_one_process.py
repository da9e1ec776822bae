"""What lesson 16's prose says of its run, against the values it glued."""


def value(glued, name):
    return glued[name]["value"]


def check(glued):
    # Section 2: which side of the previous-character yardstick the run ended.
    below = value(glued, "val_loss") < value(glued, "pair_yardstick")
    assert value(glued, "pair_side") == ("below" if below else "above")

    # The attention heads: "specialised" only where one of the last two
    # positions takes half a head's weight; "hardly more than an even
    # spread" only where every head stays under twice the even spread.
    own, previous = value(glued, "own_weights"), value(glued, "previous_weights")
    focused = [h for h, (o, p) in enumerate(zip(own, previous)) if max(o, p) >= 0.5]
    near_even = all(o < 2 * value(glued, "even_own") and p < 2 * value(glued, "even_previous")
                    for o, p in zip(own, previous))
    kind = value(glued, "heads_kind")
    assert kind == ("specialised" if focused else "near even" if near_even else "leaning")
    verdict = value(glued, "heads_verdict")
    assert ("no head has specialised" in verdict) == (not focused)
    for h in focused:
        assert f"head {h} puts most of its weight" in verdict
    if not focused and near_even:
        # "less than twice what an even spread would", and said where some
        # mean is below the even spread (not "hardly more than" it)
        below = any(o < value(glued, "even_own") or p < value(glued, "even_previous")
                    for o, p in zip(own, previous))
        assert "less than twice" in verdict and "hardly more" not in verdict
        assert ("below the even spread" in verdict) == below
    if not focused and not near_even:
        # "at least twice an even spread", naming each head and position that is
        for h, (o, p) in enumerate(zip(own, previous)):
            for where, ratio in (("on its own position", o / value(glued, "even_own")),
                                 ("on the one before", p / value(glued, "even_previous"))):
                assert (f"head {h} {where}: {ratio:.2f} times" in verdict) == (ratio >= 2)
    assert glued["own_weight"]["text"] == ", ".join(f"{w:.2f}" for w in own)

    # The KV cache: each position once, the prompt and every drawn character
    # but the last, against all t positions for the t-th character without it.
    prompt, context = value(glued, "prompt_length"), value(glued, "context")
    assert value(glued, "fed_cache") == context - 1 < context
    assert value(glued, "fed_recompute") == sum(range(prompt, context))
    assert value(glued, "fed_recompute") <= value(glued, "half_square") + context
    speed = value(glued, "time_ratio")
    text = value(glued, "cache_time_verdict")
    if speed >= 1.1:
        assert text.startswith(f"the cache was {speed:.1f} times as fast")
        assert "less than in proportion" in text and speed < value(glued, "work_ratio")
    elif speed > 1 / 1.1:
        assert "saved no time" in text
    else:
        assert "was slower" in text

    # Section 3: the attention's share of a step falls with the width.
    shares = value(glued, "attention_shares")
    assert all(a > b for a, b in zip(shares, shares[1:]))
    assert glued["attention_share_most"]["text"] == f"{shares[0]:.1%}"

    # Section 5: "each factor of 16 rescued most of what was left" only if it did.
    lost = value(glued, "lost_counts")
    rescued = [1 - after / before for before, after in zip(lost, lost[1:])]
    assert value(glued, "rescue_verdict") == ("most of" if min(rescued) > 0.5
                                             else "not always most of")
    assert lost[0] > 0 and all(a >= b for a, b in zip(lost, lost[1:]))
    # "between X and Y of it" speaks of the activation column only; the
    # weight column has its own sentence, its range over every factor of 16.
    weights = value(glued, "lost_weight_counts")
    text = value(glued, "weights_rescue_verdict")
    if weights[0]:
        kept = [1 - after / before for before, after in zip(weights, weights[1:]) if before]
        assert f"between {min(kept):.0%} and {max(kept):.0%}" in text
        assert ("most of them every time" in text) == (min(kept) > 0.5)
        assert ("not always most of them" in text) == (min(kept) <= 0.5 < max(kept))
        assert ("never most of them" in text) == (max(kept) <= 0.5)
    else:
        assert "no weight gradient was lost" in text
    assert value(glued, "underflow_epochs") != value(glued, "underflow_epochs_other")
    closer = value(glued, "gap_mixed") < value(glued, "gap_noise")
    assert value(glued, "gap_verdict") == ("closer" if closer else "less close")
    assert value(glued, "gap_meaning") == ("smaller" if closer else "not smaller")
    ratio = value(glued, "half_ratio")
    assert ("times as long as" in value(glued, "half_timing")) == (ratio > 1)
