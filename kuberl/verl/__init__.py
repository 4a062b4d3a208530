"""`kuberl convert verl`: verl launch scripts as RLJob manifests (shell/ reads the bash, command.py the verl command,
knobs.py, rules.py and algorithm_rules.py map its knobs, convert.py writes the manifest)."""
