# RePa-ConvFormer-M36: the MetaFormer recipe of convformer_m36_32xb128_in1k.py with
# channel-idle MLPs (idle ratio 0.75, BatchNorm before fc1 and on the hidden layer, the
# structure RePaFormer trains), synchronised BatchNorm statistics across processes. No paper
# trains this model: the recipe is the MetaFormer one, the structure RePaFormer's.
_base_ = './convformer_m36_32xb128_in1k.py'

model = dict(backbone=dict(idle_ratio=0.75))
sync_bn = 'torch'
