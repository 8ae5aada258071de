"""A hook for the distributed tests: every rank saves its own copy of the weights and buffers."""

import os.path as osp

import torch
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS


@HOOKS.register_module()
class SaveRankWeightsHook(Hook):
    def after_train(self, runner):
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        # buffers too: BatchNorm statistics are not synchronized by DDP's gradient reduction
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        torch.save(state, osp.join(runner.work_dir, f'rank{runner.rank}_params.pth'))
