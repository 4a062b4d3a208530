"""The converter's one error type: a launch it cannot read or convert, with a message that says what to do."""


class LaunchError(ValueError):
    """A launch that cannot be read; the message says what was expected."""
