"""The rollout stage: prompts in, a RolloutBatch of responses out, on the job's generation engines.

    stage = rollout_stage(plan, groups, engines)  # chosen by configuration, never by algorithm
    batch = stage.run(prompts, step)              # groupSize responses per prompt, in prompt order

base.py holds the interface, the engines and the seeds; single_turn.py and episodes.py the two stages.
"""

from typing import Any

from kuberl.runtime.rollout.base import Engines, RolloutStage
from kuberl.runtime.rollout.single_turn import SingleTurnRollout


def rollout_stage(plan: Any, groups: Any, engines: Engines) -> RolloutStage:
    """Episodes when the job has an environment (groups.environment), one response per sample otherwise; each with
    the run's sampling and group size (`plan.settings`)."""
    settings = plan.settings  # loop/settings.py StepSettings
    pad_id = plan.tokenizer.pad_token_id if plan.tokenizer.pad_token_id is not None else 0
    if groups.environment is None:
        return SingleTurnRollout(settings.sampling, plan.tokenizer, engines, settings.group_size, pad_id)
    from kuberl.runtime.rollout.episodes import EpisodeRollout  # its environments load only when a job has one

    stage = EpisodeRollout(
        plan.job.spec, settings.sampling, plan.tokenizer, engines, groups.environment, settings.group_size, pad_id
    )
    return stage
