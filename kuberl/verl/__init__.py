"""`kuberl convert verl`: verl launch scripts as RLJob manifests (command.py reads them, knobs.py maps them)."""
