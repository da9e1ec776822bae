"""A trial's deadline: a search's workers are launched with no
timeout (they never wait for each other's messages), so before the
deadline one frozen worker (SIGSTOP) or one endless trial held the whole
search for ever. Now a worker still in a trial after ``trial_timeout``
seconds is killed and its trial failed, as a dead worker's is; the other
workers run the rest."""

from __future__ import annotations

import os
import signal
import time

import pytest

from minidist.search import Uniform, random_search
from tests.runtime.test_failures import no_leaked_segments  # noqa: F401  (autouse fixture)
from tests.runtime.test_forking_rank import alive

SPACE = {"x": Uniform(0.0, 1.0)}
DEADLINE = 1.5  # seconds; the trials that keep it take a few milliseconds


def freezing_objective(trial, pid_dir, endless=()):
    """Trial 1 stops its own process (SIGSTOP); the trials in ``endless`` never end."""
    open(os.path.join(pid_dir, str(os.getpid())), "w").close()
    if trial.number == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    if trial.number in endless:
        while True:
            time.sleep(0.1)
    time.sleep(0.01)
    return trial.params["x"]


def assert_workers_gone(pid_dir, within=2.0):
    pids = [int(name) for name in os.listdir(pid_dir)]
    deadline = time.monotonic() + within
    while [pid for pid in pids if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if alive(pid)]


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore::minidist.runtime.errors.OversubscriptionWarning")
def test_a_frozen_or_endless_trial_fails_at_its_deadline(tmp_path):
    start = time.monotonic()
    result = random_search(lambda trial: freezing_objective(trial, str(tmp_path), endless=(3,)),
                           SPACE, n_trials=8, n_workers=3, seed=0, trial_timeout=DEADLINE)
    elapsed = time.monotonic() - start
    assert elapsed < 4 * DEADLINE + 4, f"took {elapsed:.1f} s"
    by_number = {t.number: t for t in result.trials}
    assert sorted(by_number) == list(range(8)), "the third worker ran the rest"
    for number in (1, 3):
        assert by_number[number].state == "failed"
        assert by_number[number].error == (
            f"worker {by_number[number].worker} died during this trial: it did not finish "
            f"trial {number} within trial_timeout=1.5 s, and was killed")
    assert set(result.lost_workers) == {by_number[1].worker, by_number[3].worker}
    assert len(result.by_state("complete")) == 6
    assert_workers_gone(tmp_path)


@pytest.mark.timeout(60)
def test_a_frozen_worker_fails_its_optuna_trial_at_its_deadline(tmp_path):
    optuna = pytest.importorskip("optuna", reason="Optuna is an optional extra")
    from optuna.trial import TrialState

    from minidist.search import optuna_search

    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    path = str(tmp_path / "study.journal")
    start = time.monotonic()
    result = optuna_search(lambda trial: freezing_objective(trial, str(pid_dir)), SPACE,
                           n_trials=6, n_workers=2, seed=0, storage=path, sampler="random",
                           pruner="none", trial_timeout=DEADLINE)
    elapsed = time.monotonic() - start
    assert elapsed < 4 * DEADLINE + 6, f"took {elapsed:.1f} s"
    by_number = {t.number: t for t in result.trials}
    assert sorted(by_number) == list(range(6))
    assert by_number[1].state == "failed"
    assert "within trial_timeout=1.5 s, and was killed" in by_number[1].error
    assert set(result.lost_workers) == {by_number[1].worker}
    study = optuna.load_study(study_name="minidist-search", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(path)))
    states = {t.number: t.state for t in study.trials}
    assert states[1] == TrialState.FAIL and TrialState.RUNNING not in states.values()
    assert_workers_gone(pid_dir)


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), "10", True])
def test_a_bad_trial_timeout_is_refused(bad):
    with pytest.raises(ValueError, match="trial_timeout must be a positive number of seconds"):
        random_search(lambda trial: 0.0, SPACE, n_trials=1, trial_timeout=bad)
