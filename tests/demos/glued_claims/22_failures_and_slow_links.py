"""Lesson 22's prose chose its words from its numbers: the restarted runs'
weights equal the unbroken run's, the steps lost are the kill's step modulo
the checkpoint interval, the fault-tolerant group went on at 3 of 4 and took
the spare back with weights equal to the replay, the recovery ratio is the
times' ratio, the trace's bytes are DDP's divided by K, and the table's
verdicts follow from the steps and crossovers."""


def value(glued, name):
    return glued[name]["value"]


def text(glued, name):
    return glued[name]["text"]


def check(glued):
    # Section 1: elastic restarts.
    assert value(glued, "all_status_zero") is True
    assert value(glued, "all_same") is True
    assert text(glued, "same_text") == "equal, bit for bit, to the unbroken run's"
    assert value(glued, "lost_is_modulo") is True
    kill = value(glued, "kill_step")
    assert value(glued, "first_lost") == kill % value(glued, "first_every")
    assert value(glued, "last_lost") == kill % value(glued, "last_every")
    assert value(glued, "lost_world") == 3                         # "-n 3:4": one rank fewer
    assert value(glued, "lost_close") is True and text(glued, "lost_close_text") == "within"
    assert value(glued, "lost_worst") < 1e-12

    # Section 2: fault-tolerant DP.
    assert value(glued, "ft_agree") is True
    assert text(glued, "ft_agree_text") == "equal the replay's"
    assert value(glued, "ft_failed_once") == 1 and text(glued, "ft_failed_text") == \
        "its first try failed"
    assert value(glued, "ft_min_members") == 3                     # "at 3 of 4"
    assert value(glued, "ft_final_members") == 4                   # the spare joined
    assert value(glued, "ft_short_steps") == 1 and text(glued, "ft_short_text") == "One step"
    assert 0 < value(glued, "ft_recovery") < 10

    # Section 3: the ratio is the times'.
    ratio = value(glued, "elastic_mean") / value(glued, "ft_recovery")
    assert abs(float(text(glued, "recovery_ratio")) - ratio) <= 0.5 + 1e-9
    assert ratio > 1                                               # "times the ... group's"

    # Section 4: bytes exactly DDP's / K; the verdicts.
    assert value(glued, "bytes_exact") is True
    assert text(glued, "bytes_exact_text") == "exactly DDP's all_reduce bytes divided by K"
    assert value(glued, "gpt_ddp_extra") == 8                      # "one int64"
    if value(glued, "ddp_fewest"):
        assert text(glued, "steps_verdict").startswith("needs at least as many steps")
        assert f"in {value(glued, 'more_steps')} of the {value(glued, 'other_runs')} runs" in \
            text(glued, "steps_verdict")
    else:
        assert text(glued, "steps_verdict").startswith("usually needs more steps than DDP")
        assert value(glued, "more_steps") > value(glued, "other_runs") / 2   # "usually"
        assert f"fewer in {value(glued, 'fewer_steps')})" in text(glued, "steps_verdict")
    assert value(glued, "small_k") < value(glued, "large_k")
    rows = text(glued, "steps_table").splitlines()
    assert rows[2].startswith("| DDP |") and len(rows) >= 2 + 5        # DDP and every method
    assert sum("| never |" in row for row in rows) <= value(glued, "never_count")
    if value(glued, "never_count") == 0:
        assert text(glued, "never_text") == "every method reached the target on both models"
    else:
        assert text(glued, "never_text").endswith("never reached the target")
    if value(glued, "model_agrees"):
        assert text(glued, "model_agrees_text") == "the measured points agree"
    else:
        assert text(glued, "model_agrees_text").startswith("the measured points disagree")
        assert text(glued, "gpt_measured_fastest") in text(glued, "model_agrees_text")
