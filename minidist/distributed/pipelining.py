"""torch.distributed.pipelining's names are not here: they are in
:mod:`minidist.parallel.pipeline.pipelining`.

They run minidist's pipeline runtime, which is one of the strategies of
``minidist/parallel/`` and stands above ``minidist.distributed`` (the
strategies use the distributed face, never the other way round). So the
one line a ported script changes is its import::

    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    from minidist.parallel.pipeline.pipelining import PipelineStage, ScheduleGPipe

Importing this module works; asking it for any name raises an ImportError
that says where the name is.
"""

from __future__ import annotations

__all__: list[str] = []

_WHERE = "minidist.parallel.pipeline.pipelining"


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise ImportError(f"minidist.distributed.pipelining has no {name}: torch.distributed."
                      f"pipelining's names run minidist's pipeline strategy, which stands above "
                      f"minidist.distributed; write `from {_WHERE} import {name}`")
