"""A hook for the distributed tests: every rank saves its own copy of the weights."""
import os.path as osp

import torch
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS


@HOOKS.register_module()
class SaveRankWeightsHook(Hook):

    def after_train(self, runner):
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        params = {k: v.detach().clone() for k, v in model.named_parameters()}
        torch.save(params, osp.join(runner.work_dir, f'rank{runner.rank}_params.pth'))
