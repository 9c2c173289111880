# Pola-PVT-L + RetinaNet FPN, COCO 1x: the softmax baseline retinanet_pvt-l_fpn_1x_coco.py (the
# recipe of Agent-Attention's agent_pvt_l_rtn_1x_12-16-28-28.py) with only the backbone swapped
# for Pola-PVT-L ('LLLL', drop path 0.3 as the baseline's, out channels 64/128/320/512). Each
# setting with its source: docs/user_guides/protocol.md.
_base_ = './retinanet_pvt-l_fpn_1x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='PolaPVT',
        arch='large',
        attn_types='LLLL',
        drop_path_rate=0.3,  # agent_pvt_l_rtn_1x, as the baseline
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_pvt_l_mm.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))
