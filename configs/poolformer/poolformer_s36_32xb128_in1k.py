# PoolFormer-S36 (v1): poolformer_s12_32xb128_in1k.py with the s36 arch and drop path
# 0.2 (the release reports 81.4 % top-1).
_base_ = './poolformer_s12_32xb128_in1k.py'

model = dict(backbone=dict(arch='s36', drop_path_rate=0.2), head=dict(in_channels=512))
