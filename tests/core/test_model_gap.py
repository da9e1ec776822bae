"""The explanation beside every measured-vs-model line, from made-up facts."""

from minidist.model_gap import FIT_COMMAND, RunFacts, compare, explain, ratio_text, reasons


def test_ratio_text():
    assert ratio_text(13.4e-3, 29.4e-6) == "456x"
    assert ratio_text(2.1, 1.0) == "2.1x"
    assert ratio_text(0.48, 1.0) == "0.48x"
    assert ratio_text(1.0, 0.0) == "-"


def test_more_ranks_than_cores_first_call_and_default_parameters():
    facts = RunFacts(ranks=4, cores=2, transport="shm", params="default", first_call=True,
                     hold=("on `minidist simulate all_reduce -n 4 --size 128B`",))
    line = compare(13.4e-3, 29.4e-6, facts)
    assert line.startswith("measured 13.40 ms vs model 29.4 us (456x: ")
    assert "4 ranks on 2 cores: ranks take turns" in line
    assert "first call includes setup" in line
    assert f"default shm alpha/beta (fit here: {FIT_COMMAND})" in line
    assert "the model holds on `minidist simulate all_reduce -n 4 --size 128B` or with -n 2" \
        in line


def test_no_oversubscription_no_turns_and_no_fewer_ranks_advice():
    facts = RunFacts(ranks=2, cores=16, transport="shm", params="fitted")
    words = reasons(3e-3, 1e-3, facts)
    assert not any("take turns" in word for word in words)
    assert not any("default" in word for word in words)
    assert "with -n" not in explain(3e-3, 1e-3, facts)
    assert explain(3e-3, 1e-3, facts).endswith("no known cause in this run's facts")


def test_one_core():
    facts = RunFacts(ranks=2, cores=1)
    line = explain(1.0, 0.1, facts)
    assert "2 ranks on 1 core: ranks take turns" in line
    assert "on a machine with a core per rank" in line


def test_unknown_cores_says_nothing_about_them():
    assert "cores" not in explain(1.0, 0.1, RunFacts(ranks=64, cores=None))


def test_skew_counts_only_when_it_is_a_real_share():
    big = reasons(1e-3, 1e-4, RunFacts(ranks=2, cores=2, skew_s=0.4e-3))
    assert "ranks entered 400.0 us apart" in big
    small = reasons(1e-3, 1e-4, RunFacts(ranks=2, cores=2, skew_s=1e-6))
    assert not any("apart" in word for word in small)


def test_a_busy_machine_and_a_sleeping_receiver():
    words = reasons(10e-3, 10e-6, RunFacts(ranks=2, cores=2, load=6.25, slowest_message_s=9e-3))
    assert words[:2] == ["machine busy (load 6.2 on 2 cores)",
                         "a message waited 9.00 ms for its receiver to run"]
    quiet = reasons(10e-3, 10e-6, RunFacts(ranks=2, cores=2, load=0.5, slowest_message_s=1e-5))
    assert not any("busy" in word or "waited" in word for word in quiet)


def test_tiny_calls_name_their_size():
    words = reasons(1e-3, 30e-6, RunFacts(ranks=2, cores=2, nbytes=128))
    assert "128 B: per-call overhead (not in alpha) dominates" in words
    big = reasons(1e-1, 30e-3, RunFacts(ranks=2, cores=2, nbytes=100_000_000))
    assert not any("per-call" in word for word in big)


def test_close_values_say_the_model_holds():
    facts = RunFacts(ranks=4, cores=2, params="default", transport="shm")
    assert explain(1.1e-3, 1.0e-3, facts) == "1.1x: the model holds here"


def test_simulator_agrees_or_names_the_formula():
    facts = RunFacts(ranks=256, simulated=True)
    assert explain(0.0324, 0.0324, facts) == "1x: the model holds here"
    line = explain(321.7e-6, 300e-6, RunFacts(ranks=6, simulated=True, params="given"))
    assert "the closed-form formula is what approximates" in line and "cores" not in line


def test_close_values_hold_whatever_the_notes():
    facts = RunFacts(ranks=4, simulated=True, notes=("stage 3 works 2.5x stage 0's time",))
    assert explain(0.273, 0.273, facts) == "1x: the model holds here"


def test_the_option_for_fewer_ranks_is_the_callers():
    facts = RunFacts(ranks=4, cores=2, ranks_option="--stages")
    assert explain(0.9, 0.27, facts).endswith("the model holds with --stages 2")


def test_caller_notes_come_with_the_facts():
    facts = RunFacts(ranks=4, cores=8, notes=("stage 3 works 2.5x stage 0's time",),
                     hold=("on `minidist demo pipeline --simulate`",))
    line = compare(0.972, 0.273, facts, formatter=lambda value: f"{value:.3f}")
    assert line == ("measured 0.972 vs model 0.273 (3.6x: stage 3 works 2.5x stage 0's time; "
                    "the model holds on `minidist demo pipeline --simulate`)")
