"""Finding what a manifest names by reference: a built-in name, or `package.module:attribute` imported.

Reward functions (rewards/functions.py) and environments (environments/registry.py) are named this way
and resolved once at start, so a typo fails the job before any compute is spent. Each caller checks
that what it found is of its kind; the messages name the field and what to do.
"""

import importlib
from collections.abc import Mapping


def resolve_reference(
    ref: str, builtins: Mapping[str, object], field: str, kind: str, error: type[Exception], user_kind: str
) -> object:
    """A built-in by name, or the attribute `package.module:attribute` names (not yet checked to be a `kind`).

    `kind` names what is looked up in messages (reward, environment), `user_kind` what the user names
    after the colon (function, Class).
    """
    if ":" not in ref:
        if ref in builtins:
            return builtins[ref]
        raise error(
            f"{field}: unknown built-in {kind} {ref!r}; built-ins are {', '.join(builtins)}, "
            f"or name your own as package.module:{user_kind}"
        )
    module_name, _, attribute = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as failure:
        raise error(
            f"{field}: cannot import module {module_name!r} for {kind} {ref!r} ({failure}); install the package "
            "in the runtime image or put it on PYTHONPATH (spec.env)"
        ) from failure
    found = getattr(module, attribute, None)
    if found is None:
        raise error(
            f"{field}: module {module_name!r} has no attribute {attribute!r} ({kind} {ref!r}); "
            f"check the {user_kind.lower()} name after the colon"
        )
    return found
