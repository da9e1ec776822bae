"""Plain random search on worker processes: the space, reproducibility with a
seed whatever the number of workers, and failures (a trial that raises, a
worker process that dies in the middle of a trial) that leave the search's
results usable. One launch per configuration."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time

import numpy as np
import pytest

from minidist.search import Categorical, Int, LogUniform, Uniform, random_search
from minidist.search.objectives import digits_split, train_digits_trial
from minidist.search.optuna_search import import_optuna
from minidist.search.space import check_space, sample_params
from tests.runtime.test_failures import no_leaked_segments  # noqa: F401  (autouse fixture)

SPACE = {"lr": LogUniform(1e-3, 0.5), "momentum": Uniform(0.0, 0.9),
         "hidden": Int(16, 64, log=True), "activation": Categorical(["relu"])}
DATA = digits_split()


def digits_objective(trial):
    time.sleep(0.04)  # long enough that a late-starting second worker still gets trials
    return train_digits_trial(trial, epochs=2, batch_size=32, data=DATA)


# ---------------------------------------------------------------- the space

def test_each_distribution_draws_inside_its_bounds():
    rng = np.random.default_rng(0)
    draws = {name: [d.sample(rng) for _ in range(2000)] for name, d in {
        "u": Uniform(-1.0, 1.0), "log": LogUniform(1e-4, 1.0), "int": Int(3, 7),
        "logint": Int(16, 256, log=True), "cat": Categorical(["a", "b", None])}.items()}
    assert -1 <= min(draws["u"]) and max(draws["u"]) < 1
    assert 1e-4 <= min(draws["log"]) and max(draws["log"]) < 1
    # log-uniform: each factor of ten about as likely as the others
    decades = np.histogram(np.log10(draws["log"]), bins=4, range=(-4, 0))[0]
    assert decades.min() > 0.8 * 2000 / 4
    assert set(draws["int"]) == {3, 4, 5, 6, 7}
    assert all(isinstance(v, int) and 16 <= v <= 256 for v in draws["logint"])
    assert np.mean(np.array(draws["logint"]) < 64) == pytest.approx(0.5, abs=0.06)
    assert set(draws["cat"]) == {"a", "b", None}


def test_a_trials_parameters_depend_on_the_seed_and_its_number_alone():
    assert sample_params(SPACE, 3, 7) == sample_params(SPACE, 3, 7)
    assert sample_params(SPACE, 3, 7) != sample_params(SPACE, 3, 8)
    assert sample_params(SPACE, 3, 7) != sample_params(SPACE, 4, 7)


@pytest.mark.parametrize("make, message", [
    (lambda: Uniform(1.0, 1.0), "low < high"),
    (lambda: LogUniform(0.0, 1.0), "0 < low < high"),
    (lambda: Uniform(0.0, float("inf")), "finite"),
    (lambda: Int(1.5, 3), "must be an int"),
    (lambda: Int(0, 8, log=True), "low >= 1"),
    (lambda: Categorical([]), "at least one choice"),
    (lambda: Categorical("abc"), "list of choices"),
    (lambda: Categorical([object()]), "None, bool, int, float or str"),
    (lambda: check_space({"lr": 0.1}), "give a distribution"),
    (lambda: check_space({}), "empty"),
    (lambda: check_space([Uniform(0, 1)]), "dict of name"),
])
def test_a_bad_space_is_refused_with_a_clear_error(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


@pytest.mark.parametrize("kwargs, message", [
    ({"n_trials": 0}, "n_trials must be a positive int"),
    ({"n_workers": "2"}, "n_workers must be a positive int"),
    ({"seed": -1}, "seed must be a non-negative int"),
    ({"direction": "max"}, "'maximize' or 'minimize'"),
    ({"objective": 3}, "objective must be a function"),
])
def test_bad_search_arguments_are_refused_before_any_worker_starts(kwargs, message):
    arguments = dict(objective=digits_objective, space=SPACE, n_trials=4, n_workers=1, seed=0)
    arguments.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=message):
        random_search(**arguments)


def test_without_optuna_the_error_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # what a missing package looks like
    with pytest.raises(ImportError, match=r"pip install -e '\.\[search\]'"):
        import_optuna()


# ---------------------------------------------------------------- reproducible

@pytest.mark.timeout(60)
def test_the_same_seed_gives_the_same_trials_whatever_the_number_of_workers():
    one = random_search(digits_objective, SPACE, n_trials=6, n_workers=1, seed=5)
    two = random_search(digits_objective, SPACE, n_trials=6, n_workers=2, seed=5)
    other = random_search(digits_objective, SPACE, n_trials=6, n_workers=2, seed=6)
    assert [t.number for t in one.trials] == list(range(6))
    assert all(t.state == "complete" for t in one.trials + two.trials)
    assert [t.params for t in one.trials] == [t.params for t in two.trials]
    assert [t.value for t in one.trials] == [t.value for t in two.trials]
    assert [t.intermediate for t in one.trials] == [t.intermediate for t in two.trials]
    assert set(two.trials_per_worker()) == {0, 1}  # both workers took trials
    assert [t.params for t in other.trials] != [t.params for t in two.trials]
    assert one.best.value == max(t.value for t in one.trials)
    assert all(0.0 <= t.value <= 1.0 and t.end > t.start >= 0.0 for t in two.trials)


# ---------------------------------------------------------------- failures

def failing_objective(trial):
    """Cheap, with three ways to go wrong on chosen trials."""
    if trial.number == 2:
        raise RuntimeError("trial 2 failed on purpose")
    if trial.number == 4:
        os._exit(7)                          # the worker process dies mid-trial
    if trial.number == 6:
        os.kill(os.getpid(), signal.SIGKILL)  # and again, the way a machine vanishes
    if trial.number == 8:
        return float("nan")
    if trial.number == 9:
        return "high"
    time.sleep(0.05)
    for step in range(3):
        trial.report(trial.params["x"] * (step + 1), step)
    return trial.params["x"]


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore::minidist.runtime.errors.OversubscriptionWarning")
def test_failed_trials_and_dead_workers_leave_the_search_usable(tmp_path):
    result = random_search(failing_objective, {"x": Uniform(0.0, 1.0)}, n_trials=14,
                           n_workers=3, seed=1, folder=tmp_path / "search")
    by_number = {t.number: t for t in result.trials}
    assert sorted(by_number) == list(range(14)), "every trial ran, those of dead workers too"
    failed = {t.number: t.error for t in result.by_state("failed")}
    assert sorted(failed) == [2, 4, 6, 8, 9]
    assert failed[2] == "RuntimeError: trial 2 failed on purpose"
    assert "NaN" in failed[8] and "must return one number" in failed[9]
    for number, words in ((4, "code 7"), (6, "SIGKILL")):
        assert "died during this trial" in failed[number] and words in failed[number]
    lost = {by_number[4].worker, by_number[6].worker}
    assert set(result.lost_workers) == lost and len(lost) == 2
    survivor = ({0, 1, 2} - lost).pop()
    assert all(t.worker == survivor for t in result.trials if t.number > 6)
    complete = result.by_state("complete")
    assert len(complete) == 9 and all(t.intermediate == {0: t.value, 1: 2 * t.value,
                                                         2: 3 * t.value} for t in complete)
    assert result.best.value == max(t.value for t in complete)
    assert "worker" in result.summary() and "was lost" in result.summary()
    assert "[RuntimeError: trial 2 failed on purpose]" in result.table()
    # The journal: a start and an end line per trial, the dead workers' trials without an end.
    records = [json.loads(line) for line in (tmp_path / "search" / "trials.jsonl").open()]
    ends = {r["number"] for r in records if r["event"] == "end"}
    assert len(records) == 14 + 12 and ends == set(range(14)) - {4, 6}
    with pytest.raises(FileExistsError, match="already holds"):
        random_search(failing_objective, {"x": Uniform(0.0, 1.0)}, n_trials=1,
                      folder=tmp_path / "search")
    assert not math.isnan(result.wall_time)
