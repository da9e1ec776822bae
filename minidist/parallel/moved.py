"""The old module paths of ``minidist.parallel``, kept for one release.

Until the strategies were grouped into one folder per family, each was a
file of its own directly in ``minidist/parallel/`` (``zero.py``,
``tensor_parallel.py``, ...). A script that still imports one of those
paths keeps working: the import gives a stand-in module that finds each
name in the module(s) it moved to, with a one-line warning naming the new
path. Two old paths are the names of families now and need no stand-in
(``minidist.parallel.pipeline`` and ``minidist.parallel.parameter_server``:
their faces carry the names the old modules had).

This table is read by strings, never imported: it adds no dependency
between the families.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

#: old path -> the modules its names went to, the main one first
MOVED = {
    "minidist.parallel.data_parallel": ("minidist.parallel.data.ddp",
                                        "minidist.parallel.data.coordinator",
                                        "minidist.parallel.data.buckets",
                                        "minidist.parallel.data.checks",
                                        "minidist.parallel.replicas"),
    "minidist.parallel.compression": ("minidist.parallel.data.compression",
                                      "minidist.parallel.data.powersgd",
                                      "minidist.parallel.data.hooks"),
    "minidist.parallel.zero": ("minidist.parallel.data.zero", "minidist.parallel.data.fsdp",
                               "minidist.parallel.data.zero_stages", "minidist.parallel.data.costs"),
    "minidist.parallel.sync_batchnorm": ("minidist.parallel.data.sync_batchnorm",),
    "minidist.parallel.checkpoint": ("minidist.parallel.data.checkpoint_files",),
    "minidist.parallel.inference": ("minidist.parallel.data.inference",),
    "minidist.parallel.fault_tolerant_server": (
        "minidist.parallel.parameter_server.fault_tolerant",
        "minidist.parallel.parameter_server.replication",
        "minidist.parallel.parameter_server.replicated_shard",
        "minidist.parallel.parameter_server.failures"),
    "minidist.parallel.hogwild": ("minidist.parallel.parameter_server.hogwild",),
    "minidist.parallel.delayed_proximal": ("minidist.parallel.parameter_server.delayed_proximal",),
    "minidist.parallel.straggler": ("minidist.parallel.parameter_server.straggler",),
    "minidist.parallel.distbelief": ("minidist.parallel.model.distbelief",),
    "minidist.parallel.hybrid": ("minidist.parallel.model.hybrid",),
    "minidist.parallel.conv_parallel": ("minidist.parallel.model.channel_parallel",
                                        "minidist.parallel.model.spatial_parallel",
                                        "minidist.parallel.model.split_conv"),
    "minidist.parallel.model_parallel_bytes": ("minidist.parallel.model.costs",
                                               "minidist.distributed.collectives.traffic"),
    "minidist.parallel.tensor_parallel": ("minidist.parallel.tensor.layers",
                                          "minidist.parallel.tensor.regions"),
    "minidist.parallel.vocab_parallel": ("minidist.parallel.tensor.vocab",),
    "minidist.parallel.tensor_parallel_gpt": ("minidist.parallel.tensor.gpt",),
    "minidist.parallel.parallel_styles": ("minidist.parallel.placements.styles",),
    "minidist.parallel.parallelize": ("minidist.parallel.placements.parallelize",),
    "minidist.parallel.tensor.styles": ("minidist.parallel.placements.styles",),
    "minidist.parallel.tensor.parallelize": ("minidist.parallel.placements.parallelize",),
    "minidist.parallel.tensor_parallel_costs": ("minidist.parallel.tensor.costs",),
    "minidist.parallel.context_split": ("minidist.parallel.context.split",),
    "minidist.parallel.ring_attention": ("minidist.parallel.context.ring_attention",),
    "minidist.parallel.ulysses": ("minidist.parallel.context.ulysses",),
    "minidist.parallel.context_parallel_gpt": ("minidist.parallel.context.gpt",),
    "minidist.parallel.context_costs": ("minidist.parallel.context.costs",),
    "minidist.parallel.expert_parallel": ("minidist.parallel.expert.dispatch",),
    "minidist.parallel.expert_parallel_costs": ("minidist.parallel.expert.costs",),
    "minidist.parallel.pipeline_schedules": ("minidist.parallel.pipeline.schedules",
                                             "minidist.parallel.pipeline.simulate",
                                             "minidist.parallel.pipeline.labels"),
    "minidist.parallel.gpt_3d": ("minidist.parallel.mesh.gpt_3d",),
    "minidist.parallel.plan_3d": ("minidist.parallel.mesh.plan_3d",
                                  "minidist.parallel.mesh.plan_inputs",
                                  "minidist.parallel.mesh.choose_plan",
                                  "minidist.parallel.mesh.plan_command"),
}

#: names that were replaced, not moved: (old path, name) -> what stands in
#: for them now (given, with a warning, for the same release)
REPLACED = {
    ("minidist.parallel.tensor_parallel_gpt", "group_of"):
        "minidist.distributed.device_mesh.as_group",
}


class MovedModuleWarning(DeprecationWarning):
    """An old ``minidist.parallel`` module path was imported."""


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers the old paths with a stand-in module; every other import is
    left to Python's own finders."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return None   # an ordinary, empty module

    def exec_module(self, module) -> None:
        old, new = module.__name__, MOVED[module.__name__]
        # stacklevel 2 is the importing line: the warnings module skips
        # the import system's own frames.
        warnings.warn(f"{old} moved to {new[0]}"
                      + (f" (and {', '.join(new[1:])})" if new[1:] else "")
                      + "; import it from there: the old path goes in the next release",
                      MovedModuleWarning, stacklevel=2)
        targets = [importlib.import_module(name) for name in new]

        def __getattr__(name):
            for target in targets:
                if hasattr(target, name):
                    return getattr(target, name)
            if (old, name) in REPLACED:
                where, _, attribute = REPLACED[old, name].rpartition(".")
                warnings.warn(f"{old}.{name} is now {REPLACED[old, name]}",
                              MovedModuleWarning, stacklevel=2)
                return getattr(importlib.import_module(where), attribute)
            raise AttributeError(f"module {old!r} (now {new[0]}) has no attribute {name!r}")

        module.__getattr__ = __getattr__
        module.__dir__ = lambda: sorted({name for target in targets for name in dir(target)})
        module.__moved_to__ = new


def install() -> None:
    """Put the finder first on ``sys.meta_path``, once."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
