"""Hyper-parameter search on worker processes (lesson 15).

* :mod:`.space`: the distributions a trial's parameters are drawn from;
* :mod:`.random_search`: plain random search on N workers, no dependency;
* :mod:`.optuna_search`: the same objective and space with Optuna (an
  optional extra: ``pip install -e '.[search]'``), workers sharing one study
  through Optuna's journal file (or SQLite), pruned by its median pruner;
* :mod:`.objectives`: the digits MLP the lesson searches;
* :mod:`.plots`: trials over time, one row per worker.
"""

from minidist.search.random_search import (
    SearchResult,
    Trial,
    TrialPruned,
    TrialRecord,
    random_search,
)
from minidist.search.space import Categorical, Int, LogUniform, Uniform

__all__ = ["random_search", "optuna_search", "SearchResult", "Trial", "TrialPruned",
           "TrialRecord", "Uniform", "LogUniform", "Int", "Categorical"]


def __getattr__(name):
    # Optuna is optional: importing minidist.search must work without it, so
    # the function is imported when first asked for. (Importing the module
    # binds its name here; the function then takes the name back.)
    if name == "optuna_search":
        from minidist.search.optuna_search import optuna_search

        globals()["optuna_search"] = optuna_search
        return optuna_search
    raise AttributeError(f"module 'minidist.search' has no attribute {name!r}")
