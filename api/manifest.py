"""The RLJob resource as a whole, and turning YAML/dicts into it with errors a user can act on.

`parse_rljob` is the door: it either returns a valid `RLJob` or raises `ManifestError`
holding one `Problem` per mistake, each with the field path as written in YAML
(`spec.algorithm.groupSize`, `spec.resources.actor.tolerations[0].effect`). Nothing else
escapes it, whatever the input (a property-based test holds it to that).
"""

import difflib
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator

from kuberl.api.base import KuberlModel
from kuberl.api.rules import RULES_ERROR_TYPE
from kuberl.api.spec import RLJobSpec
from kuberl.api.status import RLJobStatus

GROUP = "kuberl.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RLJob"
PLURAL = "rljobs"
#: Names of things kuberl derives from the job must pass KubeRay's own validation
#: (ray-operator/controllers/ray/utils/validation.go `ValidateRayJobMetadata`): a RayJob name `<name>-<n>`
#: of at most 47 characters (MaxRayJobNameLength: KubeRay appends 6 for the RayCluster, whose services add
#: up to 10 more within 63), and a DNS-1035 label. 40 leaves the RayJob index six digits.
MAX_NAME_LENGTH = 40
#: DNS-1035 label: KubeRay refuses a RayJob or RayCluster name that does not start with a letter.
JOB_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


def suggested_name(name: str) -> str:
    """A name like `name` that KubeRay accepts: `7b-grpo` -> `job-7b-grpo`, `My_Job` -> `my-job`."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "job"
    cleaned = cleaned if cleaned[0].isalpha() else f"job-{cleaned}"
    return cleaned[:MAX_NAME_LENGTH].rstrip("-")


class ObjectMeta(BaseModel):
    """Kubernetes object metadata; only what kuberl reads is checked, the rest passes through."""

    model_config = {"extra": "allow", "populate_by_name": True}

    name: str = Field(
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        description="Job name: a lower-case letter first, then lower-case letters, digits and '-' (not last), at "
        "most 40 characters: KubeRay requires its RayJob `<name>-<n>` to be a DNS-1035 label of at most 47.",
    )

    @field_validator("name")
    @classmethod
    def _name_kuberay_accepts(cls, name: str) -> str:
        if not re.fullmatch(JOB_NAME_PATTERN, name):
            raise ValueError(
                f"{name!r} is not a name KubeRay accepts for the job's RayJob ({name}-0): it must start with a "
                "lower-case letter and hold only lower-case letters, digits and '-', not at the end (a DNS-1035 "
                f"label), e.g. {suggested_name(name)!r}"
            )
        return name

    namespace: str | None = Field(None, description="Namespace of the job.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations.")


class RLJob(KuberlModel):
    """An RL post-training job: `kubectl apply` it, or `kuberl run` it locally."""

    api_version: Literal["kuberl.io/v1alpha1"] = Field(alias="apiVersion", description="kuberl.io/v1alpha1")
    kind: Literal["RLJob"] = Field(description="RLJob")
    metadata: ObjectMeta = Field(description="Standard object metadata.")
    spec: RLJobSpec = Field(description="What to train and how.")
    status: RLJobStatus | None = Field(None, description="Observed state.")


@dataclass(frozen=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ManifestError(ValueError):
    """A manifest that is not a valid RLJob. `problems` holds every mistake found."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(str(self))

    def __str__(self) -> str:
        lines = [f"{self.source}: {len(self.problems)} problem(s)"]
        lines += [f"  - {problem}" for problem in self.problems]
        return "\n".join(lines)


def format_path(loc: tuple[str | int, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as `X | None` or `list[X]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def model_at(loc: tuple[str | int, ...], root: type[BaseModel] = BaseModel) -> type[BaseModel] | None:
    """Walk RLJob's models along a YAML path; None where the path leaves them."""
    model: type[BaseModel] | None = RLJob if root is BaseModel else root
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int):
            continue
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        model = _model_in(field.annotation) if field is not None else None
    return model


#: Field names people bring from elsewhere (verl's keys, old names) -> what to write instead.
FIELD_HINTS: dict[str, str] = {
    "filterOverlongPrompts": "overlongPrompt: drop",
    "trainFiles": "train (a path or a list of paths)",
    "valFiles": "validation (a path or a list of paths)",
}


def _message(error: Any) -> str:
    kind, loc = error["type"], tuple(error["loc"])
    if kind == "extra_forbidden":
        model = model_at(loc[:-1])
        renamed: dict[str, tuple[str, str]] = getattr(model, "RENAMED", {})
        if str(loc[-1]) in renamed:
            new, note = renamed[str(loc[-1])]
            return f"renamed (did you mean {new}?): {new} is {note}"
        known = [f.alias or n for n, f in model.model_fields.items()] if model else []
        close = [FIELD_HINTS[str(loc[-1])]] if str(loc[-1]) in FIELD_HINTS else []
        close = close or difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return f"unknown field{hint}; known fields here: {', '.join(known)}" if known else "unknown field"
    if kind == "missing":
        return "required field is missing"
    if kind == "value_error":  # our own validators' messages, without pydantic's "Value error, " in front
        return str(error["ctx"]["error"])
    return str(error["msg"])


def problems_from(error: ValidationError) -> list[Problem]:
    problems = []
    for item in error.errors(include_url=False):
        loc = tuple(item["loc"])
        if item["type"] == RULES_ERROR_TYPE:
            for rel, message in item["ctx"]["problems"]:
                problems.append(Problem(format_path(loc + tuple(rel)), message))
        else:
            problems.append(Problem(format_path(loc), _message(item)))
    return problems


def parse_rljob(obj: object, source: str = "<manifest>") -> RLJob:
    """A valid RLJob from a decoded manifest, or ManifestError naming every problem."""
    if not isinstance(obj, dict):
        kind = "empty" if obj is None else f"a {type(obj).__name__}"
        raise ManifestError(source, [Problem("", f"expected an RLJob mapping, found {kind}")])
    head = []
    if obj.get("apiVersion") != API_VERSION:
        head.append(Problem("apiVersion", f"must be {API_VERSION}, found {obj.get('apiVersion')!r}"))
    if obj.get("kind") != KIND:
        head.append(Problem("kind", f"must be {KIND}, found {obj.get('kind')!r}"))
    if head:  # not an RLJob at all: the spec's problems would only be noise
        raise ManifestError(source, head)
    try:
        return RLJob.model_validate(obj)
    except ValidationError as error:
        raise ManifestError(source, problems_from(error)) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys: YAML would keep the last silently."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_documents(text: str, source: str) -> list[object]:
    """Every YAML document in `text`; ManifestError if it is not YAML or holds none."""
    try:
        documents = [doc for doc in yaml.load_all(text, Loader=_UniqueKeyLoader) if doc is not None]
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        reason = getattr(error, "problem", None) or str(error)
        raise ManifestError(source, [Problem("", f"not valid YAML: {where}{reason}")]) from None
    if not documents:
        raise ManifestError(source, [Problem("", "the file holds no YAML document (it is empty)")])
    return documents


def read_manifest_text(path: str | Path) -> str:
    file = Path(path)
    try:
        return file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError(str(path), [Problem("", "no such file")]) from None
    except IsADirectoryError:
        raise ManifestError(str(path), [Problem("", "is a directory, expected an RLJob YAML file")]) from None
    except UnicodeDecodeError:
        raise ManifestError(str(path), [Problem("", "is not UTF-8 text")]) from None
    except OSError as error:
        raise ManifestError(str(path), [Problem("", f"cannot be read: {error.strerror}")]) from None


def load_rljob_file(path: str | Path) -> RLJob:
    """The one RLJob in a file (what `kuberl run` takes)."""
    source = str(path)
    documents = load_documents(read_manifest_text(path), source)
    if len(documents) > 1:
        raise ManifestError(source, [Problem("", f"holds {len(documents)} YAML documents; give one RLJob per file")])
    return parse_rljob(documents[0], source)


def is_rljob(document: object) -> bool:
    return isinstance(document, dict) and document.get("kind") == KIND


def validate_file(
    path: str | Path, *, only_rljobs: bool = False, more_checks: Callable[[RLJob], list[Problem]] | None = None
) -> list[ManifestError]:
    """Every problem of every RLJob document in a file; an empty list when all are valid.

    `only_rljobs`: other documents (a GitOps repository's ConfigMaps, Deployments ...) are skipped, and a
    file without any RLJob is fine, so the check can run over every manifest a commit touches.
    `more_checks`: further problems of each valid RLJob (`kuberl validate --cluster`: what a cluster needs).
    """
    source = str(path)
    try:
        text = read_manifest_text(path)
        if only_rljobs and not text.strip():
            return []
        documents = load_documents(text, source)
    except ManifestError as error:
        return [error]
    errors = []
    for index, document in enumerate(documents):
        if only_rljobs and not is_rljob(document):
            continue
        label = source if len(documents) == 1 else f"{source} (document {index + 1})"
        try:
            job = parse_rljob(document, label)
        except ManifestError as error:
            errors.append(error)
            continue
        problems = more_checks(job) if more_checks is not None else []
        if problems:
            errors.append(ManifestError(label, problems))
    return errors
