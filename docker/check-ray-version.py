"""Fails an image build whose Ray has no token authentication, or is not the version the image promises.

    python3 check-ray-version.py            # Ray >= kuberl.api.contract.TOKEN_AUTH_RAY_VERSION
    python3 check-ray-version.py 2.60.0     # and exactly 2.60.0 (the chart's runtime.rayVersion)

Every job's Ray cluster turns Ray's token authentication on (KubeRay's authOptions). A Ray older than the floor
ignores RAY_AUTH_MODE and serves the cluster's dashboard and Jobs API to anyone on the pod network, while the
RayJob claims the chart's Ray version. Run after kuberl is installed (the floor is kuberl's contract).
"""

import sys

import ray

from kuberl.api.contract import TOKEN_AUTH_RAY_VERSION


def version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def problem(version: str, expected: str | None) -> str | None:
    floor = ".".join(map(str, TOKEN_AUTH_RAY_VERSION))
    if version_tuple(version) < TOKEN_AUTH_RAY_VERSION:
        return f"ray {version} has no token authentication ({floor} or later): every job's Ray cluster turns it on"
    if expected is not None and version != expected:
        return f"ray {version} is not {expected}, the version this image promises (the chart's runtime.rayVersion)"
    return None


if __name__ == "__main__":
    found = problem(ray.__version__, sys.argv[1] if len(sys.argv) > 1 else None)
    if found is not None:
        sys.exit(f"check-ray-version: {found}")
    print(f"ray {ray.__version__}: token authentication")  # noqa: T201 - the build log
