"""Lesson 8: what its prose chose to say of the run's numbers holds for them."""


def value(glued, name):
    return glued[name]["value"]


def check(glued):
    bsp = value(glued, "bsp_final")
    further = max(value(glued, "async_final"), value(glued, "drop_final")) < bsp
    assert value(glued, "async_verdict").startswith("so they get further") == further
    assert (value(glued, "ssp1_verdict") == "SSP(1) follows BSP closely") == \
        (abs(value(glued, "ssp1_final") - bsp) < 0.25 * bsp)
    assert (value(glued, "ssp4_verdict") == "its loss swings back up") == \
        (value(glued, "ssp4_rise") > 0.2)
    assert (value(glued, "ssp4_end_verdict") == "ends well above") == \
        (value(glued, "ssp4_final") > 1.15 * bsp)
    calm = value(glued, "calm_most_s") < 1.3 * value(glued, "calm_least_s")
    assert value(glued, "calm_verdict").startswith("all modes take about as long") == calm
    assert value(glued, "slow_factor") > 1           # the straggler sets BSP's pace
    helps = value(glued, "ssp_straggler_s") <= 0.8 * value(glued, "bsp_straggler_s")
    assert value(glued, "ssp4_help").startswith("SSP(4) finished sooner") == helps
    assert 0 < value(glued, "async_reach_share") <= 1
    # 1b
    assert value(glued, "hot_bsp_verdict") == "still converges"
    assert value(glued, "hot_ssp_verdict").startswith("SSP(1) ends nearer") == (
        abs(value(glued, "hot_ssp1") - value(glued, "hot_bsp"))
        < abs(value(glued, "hot_ssp4") - value(glued, "hot_bsp")))
    assert value(glued, "drop_verdict").endswith("does not rescue them") == \
        (value(glued, "hot_drop") > 2 * value(glued, "hot_bsp"))
    assert 1.5 < value(glued, "async_staleness") < 4    # "about n - 1 = 3"
    # 2. staleness
    assert value(glued, "ssp_within") == "stay within τ_max"
    assert (value(glued, "ssp_pile_verdict") == "pile up *at* τ_max") == \
        (value(glued, "ssp_pile") == 4)
    assert value(glued, "late_verdict").startswith("Its late pushes have staleness 0") == \
        (value(glued, "late_stale") == 0)
    assert value(glued, "dropped_verdict").startswith("mostly the straggler") == \
        (value(glued, "dropped_slow_share") > 0.5)
    # 3. Hogwild
    assert (value(glued, "hogwild_verdict") == "close to") == (value(glued, "hogwild_off") < 0.05)
    assert 0 <= value(glued, "lost_least") <= value(glued, "lost_most") < 0.2
    assert (value(glued, "hogwild_speed") == "faster than") == \
        (value(glued, "hogwild_seconds") < value(glued, "serial_seconds"))
    # 4. D2P
    assert (value(glued, "d2p_verdict") == "end on top of each other") == \
        (value(glued, "d2p_apart") < 1e-3)
    middle = value(glued, "d2p_middle")
    assert value(glued, "d2p_middle_verdict").endswith(
        "not even behind" if middle <= 0 else "hardly behind" if middle < 1e-3 else "are behind")
    assert value(glued, "full_tau_share") <= value(glued, "ahead_share")
    # section 1: the compute is a share of the run, not said to dominate
    assert value(glued, "compute_share") < 1
    assert "dominates" not in value(glued, "calm_verdict")
    # staleness: "far staler" only if the median early push is twice the calm mean
    median, mean = value(glued, "early_median"), round(value(glued, "async_mean"), 1)
    assert (value(glued, "early_verdict") == "far staler") == (median > 2 * mean)
    assert value(glued, "stalest_verdict").startswith("they also wait") == \
        (value(glued, "straggler_async_max") < 12)
    # Hogwild: 5 writes per update
    assert value(glued, "writes_per_update") == 5
    # D2P: the apartness is of the printed objectives; "cost nothing" only if one ends lower
    apart = value(glued, "d2p_highest") / value(glued, "d2p_lowest") - 1
    assert abs(apart - value(glued, "d2p_apart")) < 1e-12
    same = value(glued, "d2p_highest") == value(glued, "d2p_lowest")
    assert value(glued, "d2p_end_verdict").startswith("all end at") == same
    if not same:
        assert ("the delay cost nothing here" in value(glued, "d2p_end_verdict")) == \
            (value(glued, "d2p_helped") != "")
    assert 0 <= value(glued, "d2p_ahead_4") <= value(glued, "d2p_points")
    assert value(glued, "d2p_gradients") % 3 == 0
