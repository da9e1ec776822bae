"""Lesson 5: what its prose chose to say of the run's numbers holds for them."""


def value(glued, name):
    return glued[name]["value"]


def check(glued):
    gap = value(glued, "accuracy_gap")
    assert (value(glued, "accuracy_verdict") == "reach the single-process accuracy") == (gap == 0)
    assert (value(glued, "gap_verdict") == "up to float32 rounding") == \
        (value(glued, "largest_gap") < 1e-4)
    single = value(glued, "single_seconds")
    parallel = min(value(glued, "coordinator_seconds"), value(glued, "ddp_seconds"))
    assert (value(glued, "speed_verdict") == "are not faster") == (parallel >= single)
    # "sit ... bytes above the formulas"; "grows 3 times ... 1.5 times (the formulas)"
    assert value(glued, "bytes_above_least") >= 0
    assert abs(value(glued, "coordinator_growth") - 3) < 0.01
    assert abs(value(glued, "ring_growth") - 1.5) < 0.01
    on = value(glued, "overlap_first_us") < value(glued, "overlap_last_us")
    assert value(glued, "overlap_verdict").startswith("starts while backward") == on
    off = value(glued, "no_overlap_first_us") >= value(glued, "no_overlap_last_us")
    assert value(glued, "no_overlap_verdict").startswith("waits until the last gradient") == off
    assert value(glued, "first_algorithm") != "?"
    # the step "grows with k"
    steps = [value(glued, f"rank0_step_{k}") for k in (1, 2, 4)]
    assert steps == sorted(steps), steps
    follows = all(value(glued, f"rank0_step_{k}") >= value(glued, f"rank1_compute_{k}")
                  for k in (1, 2, 4))
    assert value(glued, "rank0_step_verdict").startswith("lasts as long as") == follows
    # the bytes above the formulas, each part explained
    for n in (2, 4):
        assert value(glued, f"coordinator_above_{n}") == 4 * (n - 1)      # one float32 per worker
        assert value(glued, f"count_bytes_{n}") == 8 * (n - 1)            # one-shot int64 count
        assert 0 <= value(glued, f"bucket_above_{n}") < 4 * 2 * (n - 1) * 8  # a float per chunk
    assert value(glued, "bytes_above_most") == max(
        value(glued, f"count_bytes_{n}") + value(glued, f"bucket_above_{n}") for n in (2, 4))
    later = value(glued, "overlap_last_us") > value(glued, "no_overlap_last_us")
    assert value(glued, "overlap_backward_verdict").startswith("came later") == later
    # "plus ... to ...": the extras are the printed step minus the printed compute
    extras = [round(value(glued, f"rank0_step_{k}"), 1) - round(value(glued, f"rank1_compute_{k}"), 1)
              for k in (1, 2, 4)]
    assert abs(min(extras) - value(glued, "rank0_extra_least")) < 1e-9
    for k in (2, 4):
        assert k * 0.999 <= value(glued, f"region_ratio_{k}") < k * 1.5
    covered = value(glued, "overlap_messages_us") >= \
        value(glued, "overlap_last_us") - value(glued, "no_overlap_last_us")
    assert value(glued, "overlap_rest_verdict").startswith("which is as much") == covered
