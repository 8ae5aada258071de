"""The shared pieces of the command-line tools in ``tools/``: the common arguments and the one
place errors become exit statuses (:mod:`.args`); input and output checks that fail in one line
before any work starts (:mod:`.inputs`, :mod:`.outputs`; the config checks they run are the
library's, :mod:`mmrepa.config`); example batches (:mod:`.batches`); CPU / Slurm process groups
(:mod:`.distributed`); the runner, and the garbage collector's setting of a tool process
(:mod:`.runner`). Imported only by ``tools/`` (and tests), never by the library.

Importing it makes the process a tool's: the warnings filter and the one-line excepthook of
:func:`mmrepa.seams.install_tool_seams`, before the tool reads any config."""

from ...seams import install_tool_seams

install_tool_seams()
