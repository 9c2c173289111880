# Softmax baseline, PVT Semantic-FPN protocol: PVTv2-B0 (mmdet
# `PyramidVisionTransformerV2`) + Semantic FPN, ADE20K, 512x512 crops, batch 16 (4 GPUs x 4),
# 80k iterations, AdamW lr 1e-4 wd 1e-4, poly (power 0.9, min lr 0), no warm-up, no
# paramwise rules; SyncBN in the FPN head (as mmseg's base); drop path 0.1.
#
# The PVT paper's Semantic FPN setting (ADE20K, batch 16, 80k iterations, AdamW lr 1e-4, poly
# 0.9) with the PVTv2 backbone of mmdet's `pvt/retinanet_pvtv2-b0_fpn_1x_coco.py`, on top of
# mmseg's `sem_fpn/fpn_r50_4xb4-160k_ade20k-512x512.py` (data pipeline, 4x4 batch). Neither
# mmseg, the PVT repository (whai362/PVT segmentation/configs/sem_fpn/PVT/: PVT v1 only) nor the
# dense code of PolaFormer's lineage (Agent-Attention: PVT v1 and Swin) ships a PVTv2 Semantic
# FPN config; the PVT v1 configs of this project follow Agent-Attention's (8x2 x 40k at lr 2e-4).
#
# This file carries the protocol; `fpn_pola-pvtv2-b0_4xb4-80k_ade20k-512x512.py` inherits
# it and swaps only the backbone; the b1/b2 baselines change only the backbone.
_base_ = 'mmseg::sem_fpn/fpn_r50_4xb4-160k_ade20k-512x512.py'

custom_imports = dict(imports=['polaformer_mm', 'mmdet.models'], allow_failed_imports=False)

model = dict(
    pretrained=None,  # the base sets open-mmlab://resnet50_v1c
    backbone=dict(
        _delete_=True,
        type='mmdet.PyramidVisionTransformerV2',
        embed_dims=32,
        num_layers=[2, 2, 2, 2],
        init_cfg=dict(
            type='Pretrained',
            checkpoint='https://github.com/whai362/PVT/'
            'releases/download/v2/pvt_v2_b0.pth')),
    neck=dict(in_channels=[32, 64, 160, 256]))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.0001, weight_decay=0.0001),
    clip_grad=None)

param_scheduler = [dict(type='PolyLR', eta_min=0.0, power=0.9, begin=0, end=80000, by_epoch=False)]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=80000, val_interval=8000)
default_hooks = dict(checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=8000))

randomness = dict(seed=0)
