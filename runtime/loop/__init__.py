"""The training loop: the run's plan and a step's settings, resolved once, and the controllers that step.

plan.py               everything checked before an actor exists (RunPlan, make_plan), with the step's settings
settings.py           StepSettings: what a step does, resolved from the spec once
controller.py         the synchronous loop: rollout -> reward -> ... -> update -> sync
async_controller.py   the same stages with the rollout running ahead (rollout.maxStaleness >= 1)
dynamic_sampling.py   more rounds of rollout until the batch has enough informative groups
step_metrics.py       a step's reward, response and batch metrics
validation.py         scoring held-out prompts (data.validation)
"""
