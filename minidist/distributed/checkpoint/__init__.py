"""``minidist.distributed.checkpoint``: checkpoints that every rank writes a
piece of and any layout reads back (torch's ``torch.distributed.checkpoint``,
"DCP").

::

    import minidist.distributed.checkpoint as dcp
    from minidist.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id="ckpt")
    ...                                   # later, on another mesh or world size
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id="ckpt")
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)

Saving writes each rank's own shards (a DTensor's local box, a replicated
tensor once) and a table of where every box lies; loading reads, on each
rank, only the saved boxes that overlap the box its new layout needs. So a
checkpoint of tp2 x dp2 loads on tp4, on FSDP's dp4, on a pipeline of
another depth or in one process.

Read in this order:

1. ``flatten.py``: a nested state dict as flat dotted keys.
2. ``metadata.py``: the folder, the chunks, boxes and their overlaps.
3. ``save.py``: snapshot, plan, write, agree, publish.
4. ``load.py``: check, plan the reads, read, agree, copy.
5. ``async_save.py``: the write in a background thread.
6. ``state_dict.py``: a model's and optimizer's state under one-process names.

Where minidist answers differently from torch (the errors say so): ``load``
returns this rank's :class:`LoadReport` (torch: None); a dtype mismatch is
refused (torch casts); ``storage_writer=``/``planner=`` are not taken, the
folder layout is torch's ``FileSystemWriter``'s with a format of its own.
"""

from __future__ import annotations

from minidist.distributed.checkpoint.async_save import AsyncSaveFuture, async_save
from minidist.distributed.checkpoint.flatten import flatten_state_dict
from minidist.distributed.checkpoint.load import LoadReport, load
from minidist.distributed.checkpoint.metadata import Metadata
from minidist.distributed.checkpoint.save import save

__all__ = ["AsyncSaveFuture", "LoadReport", "Metadata", "async_save", "flatten_state_dict",
           "load", "save"]
