"""Start-up checks that the reward can score the data: a mismatch stops the job before any compute.

Before these checks, a verl-layout file (the expected answer in `reward_model.ground_truth`) scored with
a built-in that read only `answer` failed every sample and the job trained on nothing, its only sign the
`reward/failed` count. Now the built-ins read both layouts (rewards/sample.py), and a record that holds
no expected answer, or a data_source that by_data_source has no scorer for, is refused here, naming the
split, the record and what to do.
"""

from collections import Counter
from pathlib import Path

from kuberl.api import RewardSpec
from kuberl.runtime.data import PromptDataset
from kuberl.runtime.rewards.builtin import NEEDS_GROUND_TRUTH
from kuberl.runtime.rewards.functions import RewardConfigError, split_file_reference
from kuberl.runtime.rewards.sample import REFERENCE_FIELDS, data_source, ground_truth
from kuberl.runtime.rewards.verl_scorers import known_sources, scorer_for

#: Records named in an error before "and N more".
SHOWN = 3


def check_reward_inputs(reward: RewardSpec, splits: dict[str, PromptDataset | None]) -> None:
    """Raises RewardConfigError when reward.function is a built-in that cannot score some record of a split."""
    name = reward.function
    if name not in NEEDS_GROUND_TRUTH:
        return
    for field, dataset in splits.items():
        if dataset is None:
            continue
        missing = [prompt.index for prompt in dataset.prompts if ground_truth(prompt.record) is None]
        if missing:
            fields = ", ".join(sorted(dataset[missing[0]].record)) or "none"
            raise RewardConfigError(
                f"spec.reward.function {name} compares with each record's expected answer, but {len(missing)} "
                f"records of {field} have none in {' or '.join(REFERENCE_FIELDS)} (records {_some(missing)}; "
                f"the first has fields: {fields}); add the answers, or name a reward that needs none"
            )
        if name == "by_data_source":
            sources = Counter(data_source(prompt.record) for prompt in dataset.prompts)
            unknown = {source: count for source, count in sources.items() if scorer_for(source) is None}
            if unknown:
                listed = ", ".join(f"{source!r} ({count} records)" for source, count in unknown.items())
                raise RewardConfigError(
                    f"spec.reward.function by_data_source has no scorer for the data_source of {field}: {listed}; "
                    f"known: {known_sources()}. Write a reward for them (reward.function: path/to/reward.py, "
                    "verl's signature works) or fix the records' data_source"
                )


def _some(indices: list[int]) -> str:
    shown = ", ".join(str(i) for i in indices[:SHOWN])
    return shown + (f" and {len(indices) - SHOWN} more" if len(indices) > SHOWN else "")


def resolved_reward_file(reward: RewardSpec, base_dir: Path) -> RewardSpec:
    """The reward with a relative `file.py[:function]` made absolute from the manifest's folder; refuses a
    file that does not exist. Module references and built-ins come back unchanged."""
    ref = reward.function
    in_file = split_file_reference(ref) if ref is not None else None
    if in_file is None:
        return reward
    path = Path(in_file[0]) if Path(in_file[0]).is_absolute() else (base_dir / in_file[0]).resolve()
    if not path.is_file():
        raise RewardConfigError(
            f"spec.reward.function: reward file {path} does not exist; a relative path is read from the manifest's "
            "folder; on Kubernetes give a path inside the image or on a mounted volume"
        )
    return reward.model_copy(update={"function": f"{path}:{in_file[1]}"})
