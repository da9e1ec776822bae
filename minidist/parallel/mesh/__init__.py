"""Several parallelisms at once on one device mesh.

Read in this order:

1. :mod:`.gpt_3d`: the GPT on a dp x tp x pp mesh, equal to one process;
2. :mod:`.plan_inputs`: what a 3D plan's prediction is given: the GPT's
   shape, the machine, the plan;
3. :mod:`.plan_3d`: one step's time and memory predicted for large meshes;
4. :mod:`.choose_plan`: which dp x tp x pp to choose: every one compared,
   or the Ultra-Scale Playbook's order;
5. :mod:`.plan_command`: ``minidist plan``, which prints them (with ``--html``,
   the start of the planner page that ``viz/planner_page.py`` draws).

From other families, through their faces: the tensor family's GPT pieces
(:mod:`minidist.parallel.tensor`) and the pipeline family's runtime and
simulator (:mod:`minidist.parallel.pipeline`).
"""

from __future__ import annotations

from minidist.parallel.mesh.choose_plan import (  # noqa: F401
    PlanComparison,
    PlaybookChoice,
    compare_plans,
    factorisations,
    format_table,
    playbook_plan,
    why_impossible,
)
from minidist.parallel.mesh.gpt_3d import (  # noqa: F401
    GPT3D,
    MESH_DIMS,
    GPTStage,
    gpt_stages,
    stage_blocks,
)
from minidist.parallel.mesh.plan_3d import (  # noqa: F401
    CollectiveCost,
    StepPrediction,
    parameters_per_rank,
    peak_live,
    predict_step,
)
from minidist.parallel.mesh.plan_command import plan_command  # noqa: F401
from minidist.parallel.mesh.plan_inputs import (  # noqa: F401
    CLUSTER,
    ZERO_COLLECTIVES,
    GPTShape,
    Machine,
    Plan,
    why_not,
)

__all__ = ["GPT3D", "GPTStage", "gpt_stages", "stage_blocks", "MESH_DIMS",
           "ZERO_COLLECTIVES", "GPTShape", "Machine", "CLUSTER", "Plan", "why_not",
           "CollectiveCost", "StepPrediction", "parameters_per_rank", "predict_step", "peak_live",
           "factorisations", "PlanComparison", "format_table", "compare_plans", "PlaybookChoice",
           "playbook_plan", "why_impossible", "plan_command"]
