# PoolFormer-M36 (v1): poolformer_s12_32xb128_in1k.py with the m36 arch and drop path
# 0.3 (the release reports 82.1 % top-1).
_base_ = './poolformer_s12_32xb128_in1k.py'

model = dict(backbone=dict(arch='m36', drop_path_rate=0.3), head=dict(in_channels=768))
