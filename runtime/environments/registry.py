"""Finding an environment by name: a built-in, or `package.module:Class` imported from the image.

As reward functions (rewards/functions.py), resolved once at start, so a typo fails the job before
any compute is spent.
"""

from kuberl.runtime.environments.base import Environment
from kuberl.runtime.environments.python import PythonEnvironment
from kuberl.runtime.user_code import resolve_reference

BUILTIN_ENVIRONMENTS: dict[str, type[Environment]] = {"python": PythonEnvironment}


class EnvironmentConfigError(ValueError):
    """An environment named in the manifest cannot be used; the message names the field and what to do."""


def load_environment(ref: str, field: str = "spec.environment.name") -> type[Environment]:
    found = resolve_reference(ref, BUILTIN_ENVIRONMENTS, field, "environment", EnvironmentConfigError, "Class")
    if not (isinstance(found, type) and issubclass(found, Environment)):
        raise EnvironmentConfigError(
            f"{field}: {ref!r} is not a subclass of kuberl.runtime.environments.Environment; "
            "subclass it and implement step()"
        )
    return found
