# Softmax baseline, PVT Semantic FPN protocol: the settings of Agent-Attention's
# downstream/segmentation/configs/agent_pvt/fpn_agent_pvt_t_12-16-28-28.py (the dense code of
# PolaFormer's lineage) with PVT v1-Tiny (mmdet `PyramidVisionTransformer`): Semantic FPN,
# ADE20K, 512x512 crops, 2 images per GPU on 8 GPUs, 40k iterations, AdamW lr 2e-4 wd 1e-4 with
# no paramwise rules, poly (power 0.9) to 0 with no warm-up, validation and checkpoint every 4k
# iterations, drop path 0.1 (S 0.1, M 0.2, L 0.1: the -s/-m/-l files), float32, seed 0. Model
# and data are mmseg's `sem_fpn/fpn_r50_4xb4-160k_ade20k-512x512.py` (FPN neck, FPN head of 128
# channels with SyncBN, mmseg's ADE20K pipelines, whole-image test): the lineage's mmseg 0.x
# bases in mmseg 1 form. The GPU count is not in the lineage's config or README; 8 is
# whai362/PVT's for its Semantic FPN configs. Sources per setting: docs/user_guides/protocol.md.
#
# This file carries the protocol; `fpn_pola-pvt-t_8xb2-40k_ade20k-512x512.py` inherits it and
# swaps only the backbone.
_base_ = 'mmseg::sem_fpn/fpn_r50_4xb4-160k_ade20k-512x512.py'

custom_imports = dict(imports=['polaformer_mm', 'mmdet.models'], allow_failed_imports=False)

model = dict(
    pretrained=None,  # the base sets open-mmlab://resnet50_v1c
    backbone=dict(
        _delete_=True,
        type='mmdet.PyramidVisionTransformer',
        num_layers=[2, 2, 2, 2],
        drop_path_rate=0.1,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='https://github.com/whai362/PVT/'
            'releases/download/v2/pvt_tiny.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))

train_dataloader = dict(batch_size=2)

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.0002, weight_decay=0.0001),
    clip_grad=None)

param_scheduler = [dict(type='PolyLR', eta_min=0.0, power=0.9, begin=0, end=40000, by_epoch=False)]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=40000, val_interval=4000)
default_hooks = dict(checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=4000))

randomness = dict(seed=0)
