"""Where a rank sits in a pipeline's grid of p x d ranks, and the two groups
it talks in.

With p pipeline stages and d data-parallel replicas, global rank g is stage
g % p of replica g // p. Each replica's p stages form a pipeline group (the
activations and gradients travel there), each stage's d replicas a
data-parallel group (its gradients are all-reduced there). A layout the grid
does not know, such as a DP x TP x PP mesh where every tensor-parallel rank
runs its own pipeline, passes its own two groups instead: p is then the
pipeline group's size and the rank's stage its rank there, d the
data-parallel group's size.

Cost: once, when a Pipeline is built, every rank creates all d + p groups in
the same order (``new_group``'s rule), none with d = 1.
"""

from __future__ import annotations

import minidist.distributed as dist
from minidist.distributed.device_mesh import as_group


def pipeline_grid(data_parallel=None, pipeline_group=None, data_parallel_group=None):
    """This rank's ``(stages, stage, data_parallel, replica, pipeline_group,
    data_parallel_group)``: the grid of the whole launch with
    ``data_parallel`` replicas (1 if None), or the one the given groups make."""
    if pipeline_group is not None or data_parallel_group is not None:
        return _given(pipeline_group, data_parallel_group, data_parallel)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    data_parallel = 1 if data_parallel is None else data_parallel
    if isinstance(data_parallel, bool) or not isinstance(data_parallel, int) \
            or data_parallel < 1 or world_size % data_parallel:
        raise ValueError(f"rank {rank}: data_parallel={data_parallel!r} must be a whole number "
                         f">= 1 that divides the world size {world_size}")
    stages = world_size // data_parallel
    stage, replica = rank % stages, rank // stages
    return (stages, stage, data_parallel, replica,
            *_make_groups(stages, data_parallel, stage, replica))


def _given(pipeline_group, data_parallel_group, data_parallel):
    """The caller's groups (a mesh's "pp" and "dp"), checked."""
    rank = dist.get_rank()
    pipeline_group = as_group(pipeline_group, "Pipeline pipeline_group")
    data_parallel_group = as_group(data_parallel_group, "Pipeline data_parallel_group")
    replicas = 1 if data_parallel_group is None else dist.get_world_size(data_parallel_group)
    if pipeline_group is None and replicas > 1:
        raise ValueError(f"rank {rank}: a data_parallel_group of {replicas} ranks "
                         "needs its pipeline_group too (None would be the whole world); pass "
                         "both, e.g. mesh.get_group('pp') and mesh.get_group('dp')")
    if data_parallel is not None and data_parallel != replicas:
        raise ValueError(f"rank {rank}: data_parallel={data_parallel!r} but the "
                         f"data_parallel_group has {replicas} ranks; leave data_parallel "
                         "out when passing the groups")
    stage = dist.get_rank(pipeline_group)
    replica = 0 if data_parallel_group is None else dist.get_rank(data_parallel_group)
    if stage < 0 or replica < 0:
        raise ValueError(f"rank {rank} is not a member of the pipeline_group or "
                         "data_parallel_group it was given: pass this rank's groups "
                         "(mesh.get_group('pp'), mesh.get_group('dp'))")
    return (dist.get_world_size(pipeline_group), stage, replicas, replica, pipeline_group,
            data_parallel_group)


def _make_groups(p: int, d: int, stage: int, replica: int):
    """This rank's pipeline and data-parallel groups, every group created by
    every rank in the same order (``new_group``'s rule); none with d = 1."""
    if d == 1:
        return None, None
    pipeline_group = data_parallel_group = None
    for r in range(d):
        group = dist.new_group([r * p + s for s in range(p)])
        if r == replica:
            pipeline_group = group
    for s in range(p):
        group = dist.new_group([r * p + s for r in range(d)])
        if s == stage:
            data_parallel_group = group
    return pipeline_group, data_parallel_group
