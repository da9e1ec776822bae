"""The search with Optuna: one study in Optuna's journal file shared by worker
processes, pruning by the median pruner, a crashed worker's trial set to FAIL
with the study still loadable and resumable, and what is reproducible with a
seed. Skipped without Optuna (an optional extra)."""

from __future__ import annotations

import os
import time

import pytest

optuna = pytest.importorskip(
    "optuna", reason="Optuna is an optional extra: pip install -e '.[search]' to run these")

from optuna.trial import TrialState  # noqa: E402

from minidist.search import Uniform, optuna_search  # noqa: E402
from tests.runtime.test_failures import no_leaked_segments  # noqa: F401, E402  (autouse fixture)

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = {"x": Uniform(0.0, 1.0), "y": Uniform(0.0, 1.0)}


def curve(trial, steps=4, pause=0.01):
    """A cheap objective with a learning curve: x * (step + 1) / steps.
    Small x is the deliberately bad region: its curve stays low from the start."""
    x = trial.params["x"]
    for step in range(steps):
        time.sleep(pause)
        trial.report(x * (step + 1) / steps, step)
        if trial.should_prune():
            from minidist.search import TrialPruned

            raise TrialPruned()
    return x - 0.1 * trial.params["y"]


@pytest.mark.timeout(60)
def test_workers_share_one_study_in_the_journal_file(tmp_path):
    path = tmp_path / "study.journal"
    result = optuna_search(curve, SPACE, n_trials=12, n_workers=2, seed=0, storage=str(path),
                           sampler="random", pruner="none")
    assert result.engine == "optuna" and not result.lost_workers
    assert [t.number for t in result.trials] == list(range(12))
    assert all(t.state == "complete" for t in result.trials)
    assert set(result.trials_per_worker()) == {0, 1}
    # each worker's sampler has its own seed: no trial proposed twice
    assert len({(t.params["x"], t.params["y"]) for t in result.trials}) == 12
    # another process sees the same study in the file
    study = optuna.load_study(study_name="minidist-search", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(path))))
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 12
    assert study.best_value == pytest.approx(result.best.value)
    assert result.best.value == max(t.value for t in result.trials)


@pytest.mark.timeout(60)
def test_the_median_pruner_stops_trials_in_the_bad_region(tmp_path):
    result = optuna_search(curve, SPACE, n_trials=16, n_workers=2, seed=3,
                           storage=str(tmp_path / "study.journal"), sampler="random",
                           pruner="median")
    pruned, complete = result.by_state("pruned"), result.by_state("complete")
    assert len(pruned) >= 2 and len(pruned) + len(complete) == 16
    mean = lambda trials: sum(t.params["x"] for t in trials) / len(trials)
    assert mean(pruned) < mean(complete)
    # a pruned trial stopped early: fewer reports than the 4 steps of a full one
    assert all(len(t.intermediate) < 4 for t in pruned)
    assert all(len(t.intermediate) == 4 for t in complete)


def crash_on_trial_3(trial):
    if trial.number == 3:
        os._exit(9)  # the worker dies in the middle of the trial
    if trial.number == 5:
        raise ValueError("trial 5 raised on purpose")
    return curve(trial, steps=2)


@pytest.mark.timeout(60)
def test_a_crashed_worker_leaves_its_trial_failed_and_the_study_resumable(tmp_path):
    path = str(tmp_path / "study.journal")
    result = optuna_search(crash_on_trial_3, SPACE, n_trials=8, n_workers=2, seed=0,
                           storage=path, sampler="random", pruner="none")
    (dead,) = result.lost_workers
    by_number = {t.number: t for t in result.trials}
    assert sorted(by_number) == list(range(8))
    assert by_number[3].state == "failed" and by_number[3].worker == dead
    assert "worker" in by_number[3].error and "died during this trial" in by_number[3].error
    assert "code 9" in by_number[3].error
    assert by_number[5].state == "failed"
    assert by_number[5].error == "ValueError: trial 5 raised on purpose"
    assert len(result.by_state("complete")) == 6
    # The study in the file: loadable, nothing left RUNNING, the crash FAIL.
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(path))
    study = optuna.load_study(study_name="minidist-search", storage=storage)
    states = {t.number: t.state for t in study.trials}
    assert states[3] == TrialState.FAIL and TrialState.RUNNING not in states.values()
    # ... and resumable: three more trials in the same study.
    more = optuna_search(crash_on_trial_3, SPACE, n_trials=3, n_workers=2, seed=0,
                         storage=path, sampler="random", pruner="none")
    assert [t.number for t in more.trials] == [8, 9, 10]
    assert all(t.state == "complete" for t in more.trials)
    assert len(more.study.trials) == 11
    # the resumed workers draw new points, not the first run's again
    first = {(t.params["x"], t.params["y"]) for t in result.trials if t.params}
    assert not first & {(t.params["x"], t.params["y"]) for t in more.trials}
    with pytest.raises(ValueError, match="was created to maximize, not to minimize"):
        optuna_search(curve, SPACE, n_trials=1, storage=path, direction="minimize")


@pytest.mark.timeout(90)
def test_one_worker_with_a_seed_is_reproducible_pruning_included(tmp_path):
    """What Optuna guarantees: a seeded sampler in one process gives the same
    trials. (With several workers it does not: what TPE has seen, and which
    curves the pruner compares with, depend on the order trials finish.)"""
    runs = [optuna_search(curve, SPACE, n_trials=14, n_workers=1, seed=seed,
                          storage=str(tmp_path / f"{index}.journal"), sampler="tpe",
                          pruner="median")
            for index, seed in enumerate((11, 11, 12))]
    first, again, other = ([(t.params, t.state, t.value) for t in run.trials] for run in runs)
    assert first == again
    assert [p for p, _, _ in first] != [p for p, _, _ in other]
    assert any(state == "pruned" for _, state, _ in first)  # the pruner was in the run


@pytest.mark.parametrize("kwargs, error, message", [
    ({"storage": 3}, TypeError, "path of a journal file"),
    ({"sampler": "grid"}, ValueError, "sampler must be 'tpe', 'random'"),
    ({"pruner": "hyperband"}, ValueError, "pruner must be 'median'"),
    ({"study_name": ""}, ValueError, "study_name"),
])
def test_bad_optuna_arguments_are_refused(tmp_path, kwargs, error, message):
    arguments = dict(objective=curve, space=SPACE, n_trials=2, storage=str(tmp_path / "s"))
    arguments.update(kwargs)
    with pytest.raises(error, match=message):
        optuna_search(**arguments)


def test_a_folder_is_not_a_journal_file(tmp_path):
    with pytest.raises(ValueError, match="not a folder"):
        optuna_search(curve, SPACE, n_trials=1, storage=str(tmp_path))
