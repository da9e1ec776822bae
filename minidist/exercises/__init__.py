"""Exercises: fill in a function, check it on real processes and the simulator.

    minidist exercise list
    minidist exercise start ring_allreduce        # copies the skeleton here
    minidist exercise check ring_allreduce        # checks ./ring_allreduce.py

Each exercise is one module here holding its reference solution and how to
check a student's version (:class:`~.exercise.Exercise`); its skeleton is
``skeletons/NAME.py``. The checkers: :mod:`.collective_check` for the
collectives (simulator, real processes, traffic against the cost formula,
deadlocks as a wait-for chain), :mod:`.process_check` for the rest that
runs on real processes (a strategy's step, a split layer, and the
transformer exercises, whose student's function runs inside a layer of its
own module: :mod:`.attention_shard`, :mod:`.dispatch_layer`,
:mod:`.merge_recorder`), the pipeline simulator for a schedule
(:mod:`.one_f_one_b`; :mod:`.zb_h1` also on real processes, its holes
explained by :mod:`.schedule_holes`), and a change of a DTensor's layout
against ``redistribute`` (:mod:`.redistribute_layout`), DiLoCo's outer step
against NumPy's, each known mistake named (:mod:`.diloco_outer_step`), and
fault-tolerant data parallel's all_reduce over the live replicas, with a
replica killed on purpose (:mod:`.quorum_allreduce`). The command runs a check in a supervised child
process (:mod:`.supervised`), so that the student's code can neither end
it with a false pass nor hold it.
"""

from __future__ import annotations

import importlib

from minidist.exercises.exercise import CheckResult, Exercise, Failure, NotWrittenYet

#: name -> module holding ``EXERCISE``, in the order of the course
NAMES = ("tree_broadcast", "ring_allreduce", "recursive_doubling_allreduce",
         "coordinator_data_parallel", "ddp_bucketing", "parameter_server_round",
         "one_f_one_b", "zb_h1", "tensor_parallel_linear", "tensor_parallel_attention",
         "ring_attention_merge", "moe_dispatch", "redistribute_layout", "diloco_outer_step",
         "quorum_allreduce")


def get(name: str) -> Exercise:
    """The exercise called ``name``; a one-line error listing the known ones."""
    if name not in NAMES:
        raise KeyError(f"no exercise {name!r}; the exercises are: {', '.join(NAMES)} "
                       "(minidist exercise list)")
    return importlib.import_module(f"minidist.exercises.{name}").EXERCISE


def all_exercises() -> list[Exercise]:
    return [get(name) for name in NAMES]


__all__ = ["CheckResult", "Exercise", "Failure", "NotWrittenYet", "NAMES", "get",
           "all_exercises"]
