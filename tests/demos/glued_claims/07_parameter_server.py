"""Lesson 7: what its prose chose to say of the run's numbers holds for them."""


def value(glued, name):
    return glued[name]["value"]


def check(glued):
    assert (value(glued, "linear_verdict") == "come back to within the noise") == \
        (value(glued, "ps_error") < 0.1)
    gap = value(glued, "bsp_gap")
    assert value(glued, "bsp_verdict").startswith("There is no difference") == (gap == 0)
    assert gap < 1e-9      # BSP is full-batch gradient descent
    assert value(glued, "shard_verdict") == "Sharding changes nothing at all"
    # per push: the 40-byte request header and a little more; per pull: a smaller one
    push_least, push_most = value(glued, "push_extra")
    pull_least, pull_most = value(glued, "pull_extra")
    assert 40 <= push_least <= push_most < 60
    assert 0 < pull_least <= pull_most < 40
    assert value(glued, "columns_verdict") == "higher than"
    assert abs(value(glued, "server_growth") - 2) < 0.05          # "it doubles"
    assert abs(value(glued, "sharded_share") - 0.5) < 0.05        # n N / S, S = 2
    assert abs(value(glued, "ring_2_over_n") - 1) < 0.01
    assert abs(value(glued, "ring_4_over_n") - 1.5) < 0.01
    rates = value(glued, "server_rates")
    assert abs(value(glued, "rate_growth") - rates[-1] / rates[0]) < 1e-9
    assert (value(glued, "versions_verdict") == "one update per step") == \
        (value(glued, "versions") == " and ".join([str(value(glued, "mlp_steps"))] * 2))
    assert (value(glued, "loss_verdict") == "falls") == \
        (value(glued, "loss_last") < value(glued, "loss_first"))
    assert (value(glued, "idle_verdict") == "already wait for most of each step") == \
        (value(glued, "idle_least") > 0.5)
    assert value(glued, "gradient_ms") < value(glued, "step_ms")
    assert (value(glued, "fast_idle_verdict") == "wait almost the whole run") == \
        (value(glued, "fast_idle_least") > 0.9)
    assert value(glued, "slow_step_ms") >= 20                     # worker 2's sleep
    assert (value(glued, "straggler_verdict") == "mostly green") == \
        (value(glued, "straggler_green") > 0.5)
    # the straggler's green share is of the printed milliseconds
    computing, waiting = value(glued, "straggler_computing"), value(glued, "straggler_waiting")
    assert abs(value(glued, "straggler_green") - computing / (computing + waiting)) < 1e-9
    # the MB/s trend is worded from its stated thresholds
    growth = value(glued, "rate_growth")
    verdict = value(glued, "rate_verdict")
    assert verdict.startswith("hardly changes") == (abs(growth - 1) < 0.1)
    assert verdict.startswith("grows") == (abs(growth - 1) >= 0.1 and growth > 1)
