# Softmax baseline, PVT Semantic-FPN Cityscapes protocol: mmseg's
# `sem_fpn/fpn_r50_4xb2-80k_cityscapes-512x1024.py` (Semantic FPN, Cityscapes, 512x1024 crops of
# images resized to 2048x1024 x 0.5-2.0, whole-image 1024x2048 evaluation, 4 GPUs x 2 images,
# mmseg's 80k schedule: 80k iterations, validation and checkpoint every 8k, SyncBN in the FPN
# head) with PVT v1-Tiny (mmdet `PyramidVisionTransformer`, drop path 0.1) and a PVT
# Semantic-FPN optimizer (AdamW lr 1e-4 wd 1e-4: the lineage's 2e-4 for 16 images per step, at
# the 8 images of this schedule; poly 0.9 to 0, no warm-up, no paramwise rules) in place of the
# ResNet's SGD (mmseg's poly floor of 1e-4 would hold an AdamW lr of 1e-4 constant).
# `fpn_pola-pvt-t_4xb2-80k_cityscapes-512x1024.py` inherits this file and swaps only the
# backbone; the s/m/l baselines change only the PVT size.
_base_ = 'mmseg::sem_fpn/fpn_r50_4xb2-80k_cityscapes-512x1024.py'

custom_imports = dict(imports=['polaformer_mm', 'mmdet.models'], allow_failed_imports=False)

model = dict(
    pretrained=None,  # the base sets open-mmlab://resnet50_v1c
    backbone=dict(
        _delete_=True,
        type='mmdet.PyramidVisionTransformer',
        num_layers=[2, 2, 2, 2],
        init_cfg=dict(
            type='Pretrained',
            checkpoint='https://github.com/whai362/PVT/'
            'releases/download/v2/pvt_tiny.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.0001, weight_decay=0.0001),
    clip_grad=None)

param_scheduler = [dict(type='PolyLR', eta_min=0.0, power=0.9, begin=0, end=80000, by_epoch=False)]

randomness = dict(seed=0)
