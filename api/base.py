"""The base every RLJob model shares: camelCase in YAML, snake_case in Python, unknown fields refused."""

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class KuberlModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=False,
        validate_default=True,
        # Field descriptions are the documentation (CRD, `kuberl explain`); a test checks none is missing.
        use_attribute_docstrings=False,
    )

    def to_manifest(self) -> dict[str, object]:
        """The YAML-ready form: camelCase keys, enums as strings; parsing it gives this model back.

        A null whose default is null means "not set" and is left out; a null that overrides a default
        (`dualClipC: null` turns dual clip off) is kept, or the round trip would bring the default back.
        """
        return _without_default_nulls(self, self.model_dump(mode="json", by_alias=True))


def _without_default_nulls(model: BaseModel, dumped: dict[str, Any]) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    for name, field in type(model).model_fields.items():
        key = field.alias or name
        if key not in dumped:
            continue
        value = getattr(model, name)
        if value is None:
            if field.default is not None or field.default_factory is not None:
                kept[key] = None
            continue
        kept[key] = _pruned(value, dumped[key])
    return kept


def _pruned(value: Any, dumped: Any) -> Any:
    if isinstance(value, BaseModel):
        return _without_default_nulls(value, dumped)
    if isinstance(value, list | tuple):
        return [_pruned(item, out) for item, out in zip(value, dumped, strict=True)]
    if isinstance(value, dict):
        return {key: _pruned(value[key], dumped[key]) for key in value}
    return dumped
