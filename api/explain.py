"""`kuberl explain spec.algorithm.groupSize`: a field's documentation, read from the models."""

import enum
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from kuberl.api.manifest import RLJob, _model_in
from kuberl.api.verl_defaults import VERL_DIFFERENCES


class UnknownFieldPath(ValueError):
    pass


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(arg) for arg in typing.get_args(annotation) if arg is not type(None)]
        return " | ".join(names)
    if origin is list:
        return f"[]{_type_name(typing.get_args(annotation)[0])}"
    if origin is dict:
        return f"map[string]{_type_name(typing.get_args(annotation)[1])}"
    if origin is typing.Literal:
        return "string"
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return "object"
        if issubclass(annotation, enum.Enum):
            return "string"
        return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(annotation, annotation.__name__)
    return "object"


def _enum_values(annotation: Any) -> list[str]:
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [str(member.value) for member in annotation]
    if typing.get_origin(annotation) is typing.Literal:
        return [str(arg) for arg in typing.get_args(annotation)]
    values: list[str] = []
    for arg in typing.get_args(annotation):
        values += _enum_values(arg)
    return values


def _default(field: FieldInfo) -> str | None:
    if field.default_factory is not None or field.default in (PydanticUndefined, None):
        return None
    value = field.default
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _fields(model: type[BaseModel]) -> list[tuple[str, FieldInfo]]:
    return [(field.alias or name, field) for name, field in model.model_fields.items()]


def explain(path: str = "") -> str:
    """Documentation of the field at a dotted YAML path (`spec.rollout.engine`), or of the RLJob itself."""
    parts = [part for part in path.split(".") if part]
    if parts and parts[0].lower() in ("rljob", "rlj"):
        parts = parts[1:]
    model: type[BaseModel] | None = RLJob
    field: FieldInfo | None = None
    walked: list[str] = []
    for part in parts:
        if model is None:
            raise UnknownFieldPath(f"{'.'.join(walked)} has no fields; {part!r} does not exist")
        known = dict(_fields(model))
        if part not in known:
            raise UnknownFieldPath(
                f"{'.'.join([*walked, part])}: no such field; fields of {'.'.join(walked) or 'RLJob'}: "
                + ", ".join(known)
            )
        field = known[part]
        walked.append(part)
        model = _model_in(field.annotation)
    lines = [f"FIELD:    {'.'.join(walked) or 'RLJob'}"]
    if field is not None:
        lines.append(f"TYPE:     {_type_name(field.annotation)}")
        values = _enum_values(field.annotation)
        if values:
            lines.append(f"VALUES:   {', '.join(values)}")
        default = _default(field)
        if default is not None:
            lines.append(f"DEFAULT:  {default}")
        if field.is_required():
            lines.append("REQUIRED: yes")
        difference = VERL_DIFFERENCES.get(".".join(walked[1:])) if walked[:1] == ["spec"] else None
        if difference is not None:
            lines.append(f"VERL:     {difference.verl()} (kuberl differs: {difference.why})")
    description = (field.description if field is not None else None) or (model.__doc__ if model else None) or ""
    lines += ["", "DESCRIPTION:", f"  {description.strip()}"]
    if model is not None:
        lines += ["", "FIELDS:"]
        for name, sub in _fields(model):
            summary = sub.description or ""
            summary = summary if len(summary) <= 80 else summary[:77] + "..."
            required = " (required)" if sub.is_required() else ""
            lines.append(f"  {name:<24} <{_type_name(sub.annotation)}>{required}  {summary}")
    return "\n".join(lines)


def explain_verl_defaults() -> str:
    """Every field whose default differs from verl's: `kuberl explain --verl`."""
    lines = ["Defaults that differ from verl's (kuberl convert verl pins verl's in the manifest it writes):", ""]
    for path, difference in VERL_DIFFERENCES.items():
        default = difference.kuberl or _default_at(path)
        lines.append(f"spec.{path}: kuberl {default}; verl {difference.verl()}")
        lines.append(f"  {difference.why}")
    return "\n".join(lines)


def _default_at(path: str) -> str:
    """`DEFAULT:` of a spec field as explain() prints it, or what explain says instead."""
    for line in explain("spec." + path).splitlines():
        if line.startswith("DEFAULT:"):
            return line.removeprefix("DEFAULT:").strip()
    raise AssertionError(f"VERL_DIFFERENCES[{path!r}] needs its kuberl default in words (the field has none)")
