"""The opt-in of mmdet's, mmseg's and mmpretrain's own tools to mmrepa's one-line errors.

``import mmrepa`` leaves ``sys.excepthook`` and the warnings filters alone. A config run by
another project's tools (``mim train mmdet CONFIG``) gets what mmrepa's tools do, an uncaught
error whose cause is known as one line and mmengine's ``pkg_resources`` warning silenced
from then on (not while the config's bases resolve, before this import runs;
:func:`mmrepa.seams.install_tool_seams`), with one line::

    custom_imports = dict(imports=['mmrepa', 'mmrepa.one_line_errors'], allow_failed_imports=False)
"""

from .seams import install_tool_seams

install_tool_seams()
