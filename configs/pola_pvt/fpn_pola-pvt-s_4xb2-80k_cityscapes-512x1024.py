# Pola-PVT-S + Semantic FPN, Cityscapes, PVT Semantic-FPN Cityscapes protocol: data,
# schedule and optimizer (512x1024 crops, whole-image 1024x2048 evaluation, 4x2, 80k, AdamW
# lr 1e-4 wd 1e-4, poly 0.9) come from the softmax baseline
# fpn_pvt-s_4xb2-80k_cityscapes-512x1024.py; only the backbone is swapped.
_base_ = './fpn_pvt-s_4xb2-80k_cityscapes-512x1024.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='PolaPVT',
        arch='small',
        attn_types='LLLL',
        drop_path_rate=0.1,  # as mmdet's PVT (the baseline) and official PVT dense backbones
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_pvt_s_mm.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))
