# Pola-PVT-M + Cascade Mask R-CNN FPN 4conv1fc GIoU, COCO 3x (multi-scale + crop), PVT
# Cascade 3x protocol: everything (data, heads, 3x schedule, AdamW lr 1e-4 wd 1e-4, mixed
# precision, 8x2 images) is inherited from the softmax baseline
# cascade-mask-rcnn_pvt-m_fpn_4conv1fc-giou_amp-ms-crop-3x_coco.py; only the backbone is
# swapped. PVT out channels 64/128/320/512, as the baseline's.
_base_ = './cascade-mask-rcnn_pvt-m_fpn_4conv1fc-giou_amp-ms-crop-3x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='PolaPVT',
        arch='medium',
        attn_types='LLLL',
        drop_path_rate=0.1,  # as mmdet's / official PVT detection backbones
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_pvt_m_mm.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))
