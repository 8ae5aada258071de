"""Errors about configs and checkpoints, shared by the loaders, the fold-state check and the tools.

Each message names the file or key and says what to do, so that a tool can print it as one line
(:func:`mmrepa.apis.one_line_errors`) instead of a traceback.
"""


class ConfigError(ValueError):
    """A config asks for something that cannot work (the message names the option)."""


class CheckpointError(ValueError):
    """A checkpoint cannot be used: unreadable, of another architecture or form."""


class MissingKeysError(CheckpointError, KeyError):
    """A checkpoint lacks weights or statistics the model needs."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ''
