"""Finding an environment by name: a built-in, or `package.module:Class` imported from the image.

As reward functions (rewards/functions.py), resolved once at start, so a typo fails the job before
any compute is spent.
"""

import importlib

from kuberl.runtime.environments.base import Environment
from kuberl.runtime.environments.python import PythonEnvironment

BUILTIN_ENVIRONMENTS: dict[str, type[Environment]] = {"python": PythonEnvironment}


class EnvironmentConfigError(ValueError):
    """An environment named in the manifest cannot be used; the message names the field and what to do."""


def load_environment(ref: str, field: str = "spec.environment.name") -> type[Environment]:
    if ":" not in ref:
        if ref in BUILTIN_ENVIRONMENTS:
            return BUILTIN_ENVIRONMENTS[ref]
        raise EnvironmentConfigError(
            f"{field}: unknown built-in environment {ref!r}; built-ins are {', '.join(BUILTIN_ENVIRONMENTS)}, "
            "or name your own as package.module:Class"
        )
    module_name, _, attribute = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise EnvironmentConfigError(
            f"{field}: cannot import module {module_name!r} for environment {ref!r} ({error}); install the "
            "package in the runtime image or put it on PYTHONPATH (spec.env)"
        ) from error
    found = getattr(module, attribute, None)
    if found is None:
        raise EnvironmentConfigError(
            f"{field}: module {module_name!r} has no attribute {attribute!r} (environment {ref!r}); "
            "check the class name after the colon"
        )
    if not (isinstance(found, type) and issubclass(found, Environment)):
        raise EnvironmentConfigError(
            f"{field}: {ref!r} is not a subclass of kuberl.runtime.environments.Environment; "
            "subclass it and implement step()"
        )
    return found
