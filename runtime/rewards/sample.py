"""What a reward reads from a sample: the data record of its prompt, in kuberl's layout or verl's.

kuberl's own records carry the expected answer at the top level (`{"prompt": ..., "answer": "7"}`);
verl's preprocessed files carry it in `reward_model.ground_truth`, next to `data_source` (which scorer
applies) and `extra_info` (anything else). Every built-in reward reads them through these functions, so
both layouts score alike, and a record with neither answer fails at start (rewards/checks.py), not
silently on every sample.
"""

from typing import Any

#: The fields, in the order they are looked for, that may hold a record's expected answer.
REFERENCE_FIELDS = ("answer", "reward_model.ground_truth")


class MissingReference(KeyError):
    """A record without an expected answer, where the reward needs one."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def ground_truth(sample: dict[str, Any]) -> Any | None:
    """The expected answer as the record holds it: `answer`, else `reward_model.ground_truth`; None if neither.

    >>> ground_truth({"answer": "7"}), ground_truth({"reward_model": {"style": "rule", "ground_truth": "72"}})
    ('7', '72')
    >>> ground_truth({"prompt": "hi"}) is None
    True
    """
    if sample.get("answer") is not None:
        return sample["answer"]
    reward_model = sample.get("reward_model")
    if isinstance(reward_model, dict) and reward_model.get("ground_truth") is not None:
        return reward_model["ground_truth"]
    return None


def require_ground_truth(sample: dict[str, Any]) -> Any:
    """ground_truth(sample), or MissingReference naming the fields looked at and the record's own."""
    found = ground_truth(sample)
    if found is None:
        fields = ", ".join(sorted(sample)) or "none"
        raise MissingReference(
            f"the sample has no expected answer in {' or '.join(REFERENCE_FIELDS)} (its fields: {fields})"
        )
    return found


def data_source(sample: dict[str, Any]) -> str | None:
    """verl's `data_source`: which dataset a record came from, and so which scorer by_data_source applies."""
    value = sample.get("data_source")
    return None if value is None else str(value)


def extra_info(sample: dict[str, Any]) -> dict[str, Any]:
    """verl's `extra_info` (split, index, the original question, ...); {} when the record has none."""
    value = sample.get("extra_info")
    return value if isinstance(value, dict) else {}
