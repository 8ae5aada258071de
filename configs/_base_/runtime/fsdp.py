# Sharded training on mmengine's FlexibleRunner (docs/training.md, "Past one machine"): every
# rank holds 1/N of the parameters, gradients and optimizer state. A config that inherits this
# sets the FSDP unit, its outermost foldable block (a unit never splits one: refused):
#   strategy = dict(model_wrapper=dict(auto_wrap_policy=dict(block_types=['RePaSwinBlock'])))
# Mixed precision (FSDP's own, bfloat16; the optimizer keeps float32 weights): inherit
# ./fsdp_bf16.py instead of this file.
# Activation checkpointing: the backbone's with_cp (BatchNorm statistics kept right), not
# FSDP's activation_checkpointing. LAMB / LARS and clip_grad by norm need whole tensors and
# are refused: use AdamW. RepOptSGD / RepOptAdamW (and their CSLA clipping) work sharded.
runner_type = 'FlexibleRunner'
strategy = dict(
    type='FoldableFSDPStrategy',
    model_wrapper=dict(
        type='MMFullyShardedDataParallel',
        sharding_strategy='FULL_SHARD',  # 'SHARD_GRAD_OP': weights gathered once per step
        auto_wrap_policy=dict(type='foldable_block_policy', block_types=[]),
        use_orig_params=True,  # the sharded checkpoints and the optimizers need it
    ),
    sync_bn='torch',  # on CUDA only: BatchNorm over the whole batch, as the DDP configs
    state_dict_cfg='sharded',  # per-rank pieces; tools/consolidate_checkpoint.py joins them
)
# the rest of the config names sync_bn / model_wrapper_cfg for the DDP Runner: unused here
