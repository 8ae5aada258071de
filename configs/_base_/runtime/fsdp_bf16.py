# Sharded training in bfloat16 mixed precision (docs/training.md, "Mixed precision"): FSDP
# gathers, computes and reduces in bfloat16, the optimizer steps on float32 pieces, and the
# buffers (BatchNorm statistics, λ) stay float32; FoldableFSDPStrategy keeps each BatchNorm in
# its block's unit, computing in float32. The optim_wrapper stays mmengine's OptimWrapper:
# bfloat16 needs no loss scaling, and AmpOptimWrapper (autocast + GradScaler) runs on CUDA
# only. Use it as a second base after the model's config:
#   _base_ = ['./repa_swin_b_32xb128_in1k.py', '../_base_/runtime/fsdp_bf16.py']
_base_ = './fsdp.py'
strategy = dict(
    model_wrapper=dict(
        mixed_precision=dict(
            param_dtype='bfloat16', reduce_dtype='bfloat16', buffer_dtype='float32'
        )
    ),
    # SyncBatchNorm cannot be kept in float32 under mixed precision (refused): each rank's
    # BatchNorm normalises its own batch
    sync_bn=None,
)
