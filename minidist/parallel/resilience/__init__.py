"""Resilience: training that survives the failure of a rank.

Read in this order:

1. :mod:`.global_batches`: the global batch of step ``s``, whatever the
   world size (a data order that resumes on fewer ranks);
2. :mod:`.elastic_resume`: ``ElasticCheckpointer``, a whole checkpoint every
   ``every`` steps and the resume from the latest, on any world size
   (torchrun's ``--max-restarts`` restarts; the launcher's side is
   ``minidist/run_elastic.py`` and ``minidist/runtime/restarts.py``).

What the other families use from here: nothing. This family uses the
distributed checkpoints (``minidist.distributed.checkpoint``) and no other
family.
"""

from __future__ import annotations

# Elastic restarts (torchrun's --max-restarts): resume from a checkpoint.
from minidist.parallel.resilience.elastic_resume import (  # noqa: F401
    CheckpointMismatchError,
    ElasticCheckpointer,
    ResumeReport,
)
from minidist.parallel.resilience.global_batches import (  # noqa: F401
    GlobalBatchSampler,
    local_batch,
)

__all__ = [
    # Elastic restarts
    "CheckpointMismatchError", "ElasticCheckpointer", "GlobalBatchSampler", "ResumeReport",
    "local_batch",
]
