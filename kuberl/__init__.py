"""kuberl: reinforcement-learning post-training of language models as a Kubernetes-native job."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kuberl")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0"
