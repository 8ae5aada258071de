# RandFormer-S24: randformer_s12_32xb128_in1k.py with the s24 arch and drop path
# 0.1 (Table XIII; the paper reports 78.8 % top-1).
_base_ = './randformer_s12_32xb128_in1k.py'

model = dict(backbone=dict(arch='s24', drop_path_rate=0.1), head=dict(in_channels=512))
