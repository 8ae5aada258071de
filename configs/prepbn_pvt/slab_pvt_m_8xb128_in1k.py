# SLAB-PVT-M: PVT-M-PRepBN's model and recipe (prepbn_pvt_m_8xb128_in1k.py: drop path 0.3, λ
# decaying over 300,000 iterations, Table A1) with linear attention in every stage, as the
# authors' slab_pvt_m.yaml. The paper gives no number for it.
_base_ = './prepbn_pvt_m_8xb128_in1k.py'

model = dict(backbone=dict(attn_types='LLLL'))
