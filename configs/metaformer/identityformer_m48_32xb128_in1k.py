# IdentityFormer-M48: identityformer_s12_32xb128_in1k.py with the m48 arch and drop path
# 0.4 (Table XIII; the paper reports 80.4 % top-1).
_base_ = './identityformer_s12_32xb128_in1k.py'

model = dict(backbone=dict(arch='m48', drop_path_rate=0.4), head=dict(in_channels=768))
