"""mmrepa's errors: one hierarchy, one treatment.

Every error mmrepa raises for a mistake its user can fix -- a config option that cannot work, a
checkpoint of another model, a model that cannot be folded, a data file, image, calibration set,
output path or command-line value a tool cannot use, a missing optional package -- is an
:class:`MMRepaError` whose message names the file, option or key and says what to do. A tool
prints any of them as one line, ``tools/X.py: message``, and exits with status 1
(:func:`mmrepa.integrations.cli.args.one_line_errors`); the opt-in
:mod:`mmrepa.one_line_errors` does the same for mmdet's, mmseg's and mmpretrain's own tools
(see :mod:`mmrepa.seams`).

Library code raises these and never ``SystemExit``: turning an error into an exit status is the
tools' business. Each class also derives from the built-in exception the same mistake raised
before (``ValueError``, ``TypeError``, ``RuntimeError``, ``KeyError``, ``ImportError``), so that
``except ValueError`` and the like keep catching it. An error that means a bug in mmrepa (an
internal invariant broken, a module called with arguments its own code never passes) stays a
built-in exception, with its traceback.
"""


class MMRepaError(Exception):
    """Base of mmrepa's errors: a mistake the message names and says how to fix."""


class ConfigError(MMRepaError, ValueError):
    """A config asks for something that cannot work (the message names the option)."""


class ConfigTypeError(ConfigError, TypeError):
    """A config gives a module an argument it does not take, or an option of the wrong type
    (a ``TypeError`` as Python's own for an unexpected keyword argument)."""


class CheckpointError(MMRepaError, ValueError):
    """A checkpoint cannot be used: unreadable, of another architecture or form."""


class MissingKeysError(CheckpointError, KeyError):
    """A checkpoint lacks weights or statistics the model needs."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ''


class FoldError(MMRepaError, RuntimeError):
    """A model cannot be folded as it is; the message says why and what to do."""


class InputError(MMRepaError, ValueError):
    """A file or value given to a tool cannot be used: a missing data file, an image that does
    not decode, calibration or test data of another shape than the exported graph's, an output
    path that would replace an input, a command-line value out of range."""


class DependencyError(MMRepaError, ImportError):
    """An optional package the chosen options need is not installed (the message says how to
    install it; :func:`mmrepa.integrations.optional.require`)."""


__all__ = [
    'MMRepaError',
    'ConfigError',
    'ConfigTypeError',
    'CheckpointError',
    'MissingKeysError',
    'FoldError',
    'InputError',
    'DependencyError',
]
