# Pola-Swin-T + Cascade Mask R-CNN FPN 4conv1fc GIoU, COCO 3x (multi-scale + crop), Swin
# Cascade 3x protocol. Data, heads, schedule and optimizer (AdamW lr 1e-4 wd 0.05 with the
# custom_keys rules, mixed precision) come from the softmax baseline
# cascade-mask-rcnn_swin-t-p4-w7_fpn_4conv1fc-giou_amp-ms-crop-3x_coco.py;
# only the backbone is swapped (drop path 0.2 and out channels 96/192/384/768, as there).
_base_ = './cascade-mask-rcnn_swin-t-p4-w7_fpn_4conv1fc-giou_amp-ms-crop-3x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='PolaSwin',
        arch='tiny',
        attn_types='LLSS',
        window_size=7,
        linear_window_size=56,  # official windows; None: global (docs/user_guides/config.md)
        drop_path_rate=0.2,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_swin_t_mm.pth')),
    neck=dict(in_channels=[96, 192, 384, 768]))
