"""The base every RLJob model shares: camelCase in YAML, snake_case in Python, unknown fields refused."""

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
        """The YAML-ready form: camelCase keys, enums as strings, unset optional fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
