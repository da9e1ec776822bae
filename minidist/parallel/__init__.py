"""minidist.parallel: the ways of training on many ranks, one folder per family.

========================  ==============================================================
family                    what it splits, and where to start reading
========================  ==============================================================
``data/``                 the batch: DDP, compression hooks, ZeRO, FSDP, SyncBatchNorm,
                          checkpoint files, batch inference (start: ``coordinator.py``)
``parameter_server/``     the weights onto servers: synchronous and asynchronous servers,
                          fault-tolerant servers, Hogwild, D2P, stragglers (``layout.py``)
``model/``                the course's model parallelism: DistBelief, the conv/dense
                          hybrid, conv splits, a dense layer's bytes (``distbelief.py``)
``tensor/``               one layer's weight matrix (Megatron): regions, split layers,
                          the vocabulary, the GPT (``regions.py``)
``placements/``           the same splits written as DTensor layouts: torch's styles on
                          DTensors, FSDP2's ``fully_shard``
``context/``              the sequence: the zig-zag split, ring attention, Ulysses, the
                          GPT (``split.py``)
``expert/``               a mixture's experts: the all_to_all dispatch (``dispatch.py``)
``pipeline/``             the layers into stages: schedules as data, the virtual clock,
                          the runtime (``schedules.py``)
``mesh/``                 several at once: the GPT on dp x tp x pp, the 3D planner
                          (``gpt_3d.py``)
``resilience/``           training that survives a failed rank: elastic restarts that
                          resume from a checkpoint on another world size
                          (``elastic_resume.py``), fault-tolerant data parallel
                          (torchft's Manager and quorum, ``quorum.py``)
========================  ==============================================================

Each family's ``__init__`` gives its reading order (communication, then the
layers, then the model, then the costs) and is its face: a family uses
another only through that face. Below the families, :mod:`.replicas` is the
glue they share (the same start with ``broadcast_module``, the same step with
``all_reduce_gradients``). What comes next finds its home the same way:
sharding as placements beside ``data/`` and ``tensor/``, training that
survives failures in a family of its own, local SGD beside ``data/``.

Every public name of every family (its face's ``__all__``, read from the
source) is also a name of this package, imported on first use (``from minidist.parallel import Pipeline``), so that importing
one strategy does not import them all. torch's names read as torch users
write them: ``DistributedDataParallel`` (``torch.nn.parallel``),
``FullyShardedDataParallel`` and ``ShardingStrategy``
(``torch.distributed.fsdp``), ``ZeroRedundancyOptimizer``
(``torch.distributed.optim``), ``SyncBatchNorm``, ``parallelize_module``,
``ColwiseParallel``, ``RowwiseParallel``, ``SequenceParallel``,
``loss_parallel`` (``torch.distributed.tensor.parallel``, the placements
family's, on DTensors). Three names are in two families each and
are not here: ``DEFAULT_ALGORITHM``, ``STRATEGIES`` and ``format_table``;
import them from their family. The paths of before the families still import, with a
warning naming the new one (:mod:`.moved`).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from minidist.parallel import moved as _moved

_moved.install()

#: The families, in the order of the table above.
FAMILY_NAMES = ("data", "parameter_server", "model", "tensor", "placements", "context",
                "expert", "pipeline", "mesh", "resilience")


def _face_names(family: str) -> list[str]:
    """The ``__all__`` of a family's face, read from its source (nothing imported)."""
    tree = ast.parse((Path(__file__).parent / family / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "__all__"
                                                for target in node.targets):
            return list(ast.literal_eval(node.value))
    return []


#: family -> the public names its face exports, and each name's family; a
#: name that two families export (``DEFAULT_ALGORITHM``, ...) is left to them.
FAMILIES = {family: _face_names(family) for family in FAMILY_NAMES}
_COUNT = {}
for _names in FAMILIES.values():
    for _name in _names:
        _COUNT[_name] = _COUNT.get(_name, 0) + 1
_FAMILY_OF = {name: family for family, names in FAMILIES.items() for name in names
              if _COUNT[name] == 1}
FAMILIES = {family: [name for name in names if name in _FAMILY_OF]
            for family, names in FAMILIES.items()}

__all__ = sorted(_FAMILY_OF)


def __getattr__(name):
    family = _FAMILY_OF.get(name)
    if family is None:
        raise AttributeError(f"module 'minidist.parallel' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"minidist.parallel.{family}"), name)
    globals()[name] = value   # the next lookup is an ordinary attribute
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
