# Pola-PVT-L + RetinaNet FPN, COCO 1x, PVT protocol (PolaFormer paper, RetinaNet 1x with
# Pola-PVT): data, schedule and optimizer (AdamW lr 1e-4 wd 1e-4, 8x2 images) come from
# the softmax baseline retinanet_pvt-l_fpn_1x_coco.py (= mmdet's PVT RetinaNet); only
# the backbone is swapped. Out channels 64/128/320/512, as the baseline's.
_base_ = './retinanet_pvt-l_fpn_1x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='PolaPVT',
        arch='large',
        attn_types='LLLL',
        drop_path_rate=0.1,  # as mmdet's / official PVT detection backbones
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_pvt_l_mm.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))
