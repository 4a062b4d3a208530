"""Errors in reading a script: each names the script's line."""

from kuberl.verl.errors import LaunchError


class ScriptError(LaunchError):
    """What bash would refuse or stop at (an unclosed quote, division by 0), or past what the converter reads
    (a runaway value, too many commands); the message starts with the line."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
