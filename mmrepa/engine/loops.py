"""``FoldedTestLoop``: mmengine's ``TestLoop`` that gives the original model back when the test
raises.

:class:`~mmrepa.engine.hooks.ReparameterizeHook` tests a folded copy and restores the original
in ``after_test_epoch``; no hook runs when the loop raises, so a caller that catches the error
and keeps using ``runner.model`` would get the folded copy. Select this loop with
``test_cfg = dict(type='FoldedTestLoop')`` (``tools/test.py --reparam`` does) for the restore
on failure too; mmengine's loop registry is the seam, nothing is patched.
"""

from mmengine.registry import LOOPS
from mmengine.runner import TestLoop

from .hooks import ReparameterizeHook


@LOOPS.register_module()
class FoldedTestLoop(TestLoop):
    """``TestLoop`` whose ``run`` lets every :class:`ReparameterizeHook` restore the original
    model when it ends, also by an exception."""

    def run(self) -> dict:
        try:
            return super().run()
        finally:
            for hook in self.runner.hooks:
                if isinstance(hook, ReparameterizeHook):
                    hook.restore(self.runner)
