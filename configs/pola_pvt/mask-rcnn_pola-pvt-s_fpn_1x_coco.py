# Pola-PVT-S + Mask R-CNN FPN, COCO 1x, PVT protocol (PolaFormer paper, Mask R-CNN
# 1x with Pola-PVT): everything (data, 1x schedule, AdamW lr 1e-4 wd 1e-4, 8x2 images)
# is inherited from the softmax baseline mask-rcnn_pvt-s_fpn_1x_coco.py; only the
# backbone is swapped. PVT out channels 64/128/320/512, as the baseline's.
_base_ = './mask-rcnn_pvt-s_fpn_1x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='PolaPVT',
        arch='small',
        attn_types='LLLL',
        drop_path_rate=0.1,  # as mmdet's / official PVT detection backbones
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_pvt_s_mm.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))
