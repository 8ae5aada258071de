# PoolFormer-M48 (v1): poolformer_s12_32xb128_in1k.py with the m48 arch and drop path
# 0.4 (the release reports 82.5 % top-1).
_base_ = './poolformer_s12_32xb128_in1k.py'

model = dict(backbone=dict(arch='m48', drop_path_rate=0.4), head=dict(in_channels=768))
