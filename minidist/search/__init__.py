"""Hyper-parameter search on worker processes (lesson 15).

* :mod:`.space`: the distributions a trial's parameters are drawn from;
* :mod:`.random_search`: plain random search on N workers, no dependency;
* :mod:`.optuna_search`: the same objective and space with Optuna (an
  optional extra: ``pip install -e '.[search]'``; imported only when a search
  starts), workers sharing one study through Optuna's journal file (or
  SQLite), pruned by its median pruner;
* :mod:`.objectives`: the digits MLP the lesson searches;
* :mod:`.plots`: trials over time, one row per worker.

(The functions ``random_search`` and ``optuna_search`` share their modules'
names; here the names are the functions.)
"""

from minidist.search.optuna_search import optuna_available, optuna_search
from minidist.search.random_search import (
    SearchResult,
    Trial,
    TrialPruned,
    TrialRecord,
    random_search,
)
from minidist.search.space import Categorical, Int, LogUniform, Uniform

__all__ = ["random_search", "optuna_search", "optuna_available", "SearchResult", "Trial",
           "TrialPruned", "TrialRecord", "Uniform", "LogUniform", "Int", "Categorical"]
