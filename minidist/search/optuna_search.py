"""The same search with Optuna: one study, shared by N worker processes
through Optuna's own storage, trials pruned by its median pruner.

Optuna is an optional extra (``pip install -e '.[search]'``, or
``pip install 'optuna>=4'``); it is imported when a search starts, and its
absence is a clear ImportError naming that command.

**How the workers share one study** (the pattern of Optuna's "distributed
optimization" tutorial, and of the ChainerMN hackathon in Hideki Tsunashima's
slides "分散学習のあれこれ~データパラレルからモデルパラレルまで~", with processes
here where they had nodes): the parent creates the study in a *storage*
every process can open, a journal file (``JournalStorage`` over
``JournalFileBackend``: an append-only log of operations, locked per write)
or an SQLite / other database URL. Each worker opens the same storage with
``optuna.load_study`` and runs ``study.optimize(...)``. The sampler in each
worker reads every finished trial of the study from the storage before
proposing the next, so TPE learns from the trials of all workers; the median
pruner compares a trial's curve with the curves of all workers' trials.

**Who runs which trial**: the shared counter of the plain random search
(dynamic assignment): a worker takes a ticket, then runs
``study.optimize(objective, n_trials=1)``, until ``n_trials`` tickets are
taken. With pruning, trials cost very different amounts; a fixed share per
worker would leave workers idle, and a dead worker's share would go unrun.

**Seeds, and what is reproducible.** Each worker's sampler is seeded from
``(seed, worker, trials already in the study)``: distinct per worker
(the same seed in every worker would make N workers propose the same N
trials) and fresh when a study is resumed. With *one* worker the search is
reproducible: same seed, same trials, same values, same pruning. With
several, it is not, and Optuna says so: which trial a worker's sampler draws
next, what TPE has seen when it proposes, and which curves the pruner
compares against all depend on the order in which trials finish. (The plain
random search is reproducible with any number of workers because each
trial's parameters depend on its number alone; that is the price of a
sampler that learns from the others.)

**A worker that dies in the middle of a trial.** Optuna marks the trials of
dead processes FAIL by *heartbeat* only with a database storage
(``RDBStorage(heartbeat_interval=...)``); the journal file has none. So the
parent does it: the run tolerates worker deaths (``minidist.launch(...,
tolerate_failures=True)``), each trial carries its worker and run in its
user attributes, and after the launch every trial of this run still
RUNNING, whose process is gone, is set to FAIL with the worker's error. The
study stays loadable, and calling :func:`optuna_search` again on the same
storage resumes it (``n_trials`` more trials). (A worker that dies *while
writing* to the journal, not while training, leaves Optuna's lock file
behind; Optuna's ``JournalFileSymlinkLock`` breaks it after a grace period
of 30 s, so the others wait, then go on.)

**A worker that stops answering.** Each trial has a deadline,
``trial_timeout`` seconds (:mod:`~minidist.search.deadline`): a worker
still in a trial past it (an endless loop, a process stopped by SIGSTOP) is
killed, and its trial is set to FAIL as a dead worker's, with the reason.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from minidist.runtime.blas_threads import set_blas_threads
from minidist.search.deadline import TRIAL_TIMEOUT, TrialClock, Watchdog, check_trial_timeout
from minidist.search.journal import Journal
from minidist.search.random_search import (
    SearchResult,
    TrialPruned,
    TrialRecord,
    check_search_arguments,
    objective_value,
)
from minidist.search.space import check_space, trial_seed

INSTALL = "pip install -e '.[search]'  (or: pip install 'optuna>=4')"
SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "none")
STATE_NAMES = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed",
               "RUNNING": "running", "WAITING": "running"}


def optuna_available() -> bool:
    """True when Optuna 4 or newer can be imported."""
    try:
        import_optuna()
    except ImportError:
        return False
    return True


def import_optuna():
    """The optuna module, or an ImportError that says how to install it."""
    try:
        import optuna
    except ImportError as error:
        raise ImportError(f"this search needs Optuna, an optional extra of minidist: {INSTALL}"
                          ) from error
    major = int(optuna.__version__.split(".")[0])
    if major < 4:
        raise ImportError(f"this search needs Optuna 4 or newer (for its journal file storage); "
                          f"found {optuna.__version__}: {INSTALL}")
    return optuna


def open_storage(storage):
    """An Optuna storage: a database URL ("sqlite:///search.db") as an
    RDBStorage, anything else as the path of a journal file."""
    optuna = import_optuna()
    if not isinstance(storage, (str, os.PathLike)):
        # Not a storage object: each worker must open its own (a database
        # connection copied by fork is shared by accident, not by design).
        raise TypeError("storage must be the path of a journal file (say 'search.journal') or a "
                        f"database URL (say 'sqlite:///search.db'), got {storage!r}")
    text = os.fspath(storage)
    if "://" in text:
        # SQLite locks the whole file per write; wait for it rather than fail at once.
        engine = {"connect_args": {"timeout": 60}} if text.startswith("sqlite") else None
        return optuna.storages.RDBStorage(text, engine_kwargs=engine)
    if not text or Path(text).is_dir():
        raise ValueError(f"storage {text!r} must name a journal file, not a folder")
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    return JournalStorage(JournalFileBackend(text))


def make_sampler(sampler, seed: int, multiple_workers: bool):
    optuna = import_optuna()
    if callable(sampler) and not isinstance(sampler, str):
        return sampler(seed)
    if sampler == "tpe":
        # constant_liar: a running trial counts as a poor result while it runs,
        # so that workers asking at the same time are not sent to the same place.
        return optuna.samplers.TPESampler(seed=seed, constant_liar=multiple_workers)
    if sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"sampler must be 'tpe', 'random' or a function of a seed returning an "
                     f"Optuna sampler, got {sampler!r}")


def make_pruner(pruner):
    optuna = import_optuna()
    if isinstance(pruner, optuna.pruners.BasePruner):
        return pruner
    if pruner == "median":
        # Prune from the second report on, once 4 trials have finished: a trial
        # whose accuracy so far is below the median of the others' at the same step.
        return optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=1)
    if pruner in ("none", None):
        return optuna.pruners.NopPruner()
    raise ValueError(f"pruner must be 'median', 'none' or an Optuna pruner, got {pruner!r}")


class OptunaTrial:
    """What the objective is given under Optuna: the same face as
    :class:`~minidist.search.random_search.Trial` (``number``, ``params``,
    ``seed``, ``worker``, ``report``, ``should_prune``), over an Optuna trial
    (``optuna_trial``, for anything more)."""

    def __init__(self, optuna_trial, space: dict, seed: int, worker: int):
        self.optuna_trial = optuna_trial
        self.number = optuna_trial.number
        self.worker = worker
        self.seed = trial_seed(seed, optuna_trial.number)
        self.params = {name: distribution.suggest(optuna_trial, name)
                       for name, distribution in space.items()}
        self.intermediate: dict[int, float] = {}

    def report(self, value: float, step: int) -> None:
        self.optuna_trial.report(float(value), int(step))
        self.intermediate[int(step)] = float(value)

    def should_prune(self) -> bool:
        return self.optuna_trial.should_prune()


def _worker_seed(seed: int, worker: int, trials_before: int) -> int:
    return int(np.random.SeedSequence([seed, worker, trials_before]).generate_state(1)[0])


def _run_study(objective, space, n_trials, seed, storage, study_name, sampler, pruner,
               tickets_folder, run_id, trials_before, n_workers):
    """One worker: open the shared study, then one trial per ticket."""
    import minidist.distributed as dist

    optuna = import_optuna()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # the errors are in the results
    worker = dist.get_rank()
    set_blas_threads(1)  # as in the random search: N workers, N cores
    study = optuna.load_study(
        study_name=study_name, storage=open_storage(storage),
        sampler=make_sampler(sampler, _worker_seed(seed, worker, trials_before), n_workers > 1),
        pruner=make_pruner(pruner))

    clock = TrialClock(tickets_folder, worker)

    def run(optuna_trial):
        optuna_trial.set_user_attr("worker", worker)
        optuna_trial.set_user_attr("run", run_id)
        clock.started(optuna_trial.number)
        trial = OptunaTrial(optuna_trial, space, seed, worker)
        try:
            return objective_value(objective(trial))
        except TrialPruned as pruned:
            raise optuna.TrialPruned(str(pruned)) from None
        except Exception as error:
            optuna_trial.set_user_attr("error", f"{type(error).__name__}: {error}")
            raise
        finally:
            clock.finished()

    tickets = Journal(tickets_folder)
    ran = 0
    while tickets.take_ticket() < n_trials:
        study.optimize(run, n_trials=1, catch=(Exception,))
        ran += 1
    return ran


def optuna_search(objective, space: dict, n_trials: int, n_workers: int = 1, seed: int = 0, *,
                  storage, study_name: str = "minidist-search", direction: str = "maximize",
                  sampler="tpe", pruner="median", transport: str = "pipe",
                  trial_timeout: float | None = TRIAL_TIMEOUT) -> SearchResult:
    """Run ``n_trials`` more trials of ``objective`` in an Optuna study shared by
    ``n_workers`` processes.

    ``objective(trial)`` and ``space`` are those of
    :func:`~minidist.search.random_search.random_search` (the objective calls
    ``trial.report(value, step)`` and ``trial.should_prune()`` so the pruner
    can stop it). ``storage`` is a journal file path (created if needed) or a
    database URL; the study ``study_name`` in it is created, or resumed if it
    exists (with the same ``direction``). ``sampler`` is "tpe", "random" or
    ``lambda seed: optuna sampler``; ``pruner`` is "median", "none" or an
    Optuna pruner. ``trial_timeout`` is one trial's deadline in seconds
    (default 600, None for none): a worker still in a trial after it is
    killed, the trial is set to FAIL, and the other workers run the rest.
    Returns a :class:`SearchResult` of this call's trials, with the whole
    study in ``.study``.
    """
    check_search_arguments(objective, n_trials, n_workers, seed, direction)
    trial_timeout = check_trial_timeout(trial_timeout)
    space = check_space(space)
    seed = 0 if seed is None else seed
    optuna = import_optuna()
    if not isinstance(study_name, str) or not study_name:
        raise ValueError(f"study_name must be a non-empty string, got {study_name!r}")
    if not (callable(sampler) or sampler in SAMPLERS):
        make_sampler(sampler, 0, False)  # raises the error that names the choices
    make_pruner(pruner)
    opened = open_storage(storage)
    study = optuna.create_study(storage=opened, study_name=study_name, direction=direction,
                                load_if_exists=True)
    if study.direction.name.lower() != direction:
        raise ValueError(f"study {study_name!r} in {storage!r} was created to "
                         f"{study.direction.name.lower()}, not to {direction}")
    trials_before = len(study.trials)
    run_id = uuid.uuid4().hex[:12]

    from minidist.distributed.launch import launch

    with tempfile.TemporaryDirectory(prefix="minidist-tickets-") as tickets_folder:
        Journal(tickets_folder).create()
        began = time.time()
        # No timeout for the launch: its workers never wait for each other's
        # messages. The trial deadline is the watchdog's.
        with Watchdog(tickets_folder, trial_timeout) as watchdog:
            results = launch(_run_study, world_size=n_workers, transport=transport,
                             args=(objective, space, n_trials, seed, os.fspath(storage),
                                   study_name, sampler, pruner, tickets_folder, run_id,
                                   trials_before, n_workers),
                             tolerate_failures=True, timeout=None)
        ended = time.time()
    lost = {rank: _first_line(result) for rank, result in enumerate(results)
            if isinstance(result, BaseException)}
    lost.update(watchdog.overdue)  # "killed by SIGKILL" says less than why
    fail_orphans(opened, study_name, run_id, began, lost)
    study = optuna.load_study(study_name=study_name, storage=opened)
    trials = [trial_record(frozen, began) for frozen in study.trials
              if frozen.user_attrs.get("run") == run_id]
    return SearchResult(trials, n_trials, n_workers, seed, direction, ended - began, lost,
                        engine="optuna", study=study)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def fail_orphans(storage, study_name: str, run_id: str, began: float, lost: dict) -> list[int]:
    """Set to FAIL every trial of run ``run_id`` still RUNNING once its workers
    are gone (what a heartbeat does on a database storage). Returns their numbers."""
    optuna = import_optuna()
    from optuna.trial import TrialState

    study = optuna.load_study(study_name=study_name, storage=storage)
    study_id = storage.get_study_id_from_name(study_name)
    failed = []
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        ours = frozen.user_attrs.get("run")
        # A trial whose worker died before labelling it is ours if it started after we did.
        if ours != run_id and not (ours is None and frozen.datetime_start is not None
                                   and frozen.datetime_start.timestamp() >= began):
            continue
        worker = frozen.user_attrs.get("worker")
        reason = (f"worker {worker} died during this trial: "
                  f"{lost.get(worker, 'its process ended without a word')}")
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, frozen.number)
        if ours is None:
            storage.set_trial_user_attr(trial_id, "run", run_id)
        storage.set_trial_user_attr(trial_id, "error", reason)
        storage.set_trial_state_values(trial_id, TrialState.FAIL)
        failed.append(frozen.number)
    return failed


def trial_record(frozen, began: float) -> TrialRecord:
    """An Optuna FrozenTrial as a :class:`TrialRecord` (times since ``began``)."""
    start = frozen.datetime_start.timestamp() - began if frozen.datetime_start else 0.0
    end = frozen.datetime_complete.timestamp() - began if frozen.datetime_complete else start
    return TrialRecord(
        number=frozen.number, worker=frozen.user_attrs.get("worker"), params=dict(frozen.params),
        state=STATE_NAMES.get(frozen.state.name, frozen.state.name.lower()), value=frozen.value,
        start=start, end=end, error=frozen.user_attrs.get("error"),
        intermediate={int(step): value for step, value in frozen.intermediate_values.items()})


__all__ = ["optuna_search", "optuna_available", "import_optuna", "open_storage", "OptunaTrial",
           "fail_orphans", "trial_record", "INSTALL"]
