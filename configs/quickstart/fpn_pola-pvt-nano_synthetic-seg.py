# Quickstart: Semantic FPN + Pola-PVT-nano trained from scratch on the bundled synthetic data
# (polaformer_mm.datasets.synthetic: 3000 + 200 images of 64x64, upright circles, squares and
# triangles partly occluding each other, on textured backgrounds; semantic PNGs
# with 0 = background, 1-3 = circle, square, triangle). Not a paper protocol: sized so that it
# learns within minutes on 2 CPU cores. `make quickstart` (tools/quickstart.py) generates the
# data, trains, evaluates with the real IoUMetric and draws predictions.
# Delta over mmseg's Semantic FPN R-50 (ADE20K 160k) config.
_base_ = ['mmseg::sem_fpn/fpn_r50_4xb4-160k_ade20k-512x512.py']
custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

data_root = 'data/synthetic/'
metainfo = dict(
    classes=('background', 'circle', 'square', 'triangle'),
    palette=[(0, 0, 0), (220, 20, 60), (0, 130, 255), (255, 190, 0)])
num_classes = 4
img_size = 64
crop_size = (img_size, img_size)
channels = 64  # FPN and head width
norm_cfg = dict(type='BN', requires_grad=True)  # one process; the runner reverts SyncBN anyway
backbone_dims = [32, 64, 160, 256]  # PolaPVT arch 'nano'

model = dict(
    pretrained=None,
    data_preprocessor=dict(size=crop_size),
    backbone=dict(
        _delete_=True,
        type='PolaPVT',
        arch='nano',
        attn_types='LLLL',  # COMPARE=1 trains 'SSSS' (PVT softmax attention) beside it
        pretrain_img_size=img_size,  # the positional encodings are learned at this size
        drop_path_rate=0.,
        out_indices=(0, 1, 2, 3),
        init_cfg=None),  # from scratch: no ImageNet weights are needed
    # GroupNorm in the neck, as in the Mask R-CNN quickstart (mmdet's from-scratch recipe): the
    # backbone's raw stage maps change scale as it learns, the neck's outputs stay normalised
    neck=dict(
        in_channels=backbone_dims,
        out_channels=channels,
        norm_cfg=dict(type='GN', num_groups=16, requires_grad=True)),
    decode_head=dict(
        in_channels=[channels] * 4,
        channels=channels,
        num_classes=num_classes,
        norm_cfg=norm_cfg,
        dropout_ratio=0.,
        # background is about 85% of the pixels: weighted down so that telling the shapes
        # apart is not drowned by it (measured, seeds 0 / 1 / 2: mIoU 74.1 / 74.7 / 70.0 with
        # both changes, 67.2 / - / - with neither, 69.2 / 68.3 / - with the weights alone)
        loss_decode=dict(class_weight=[0.2, 1., 1., 1.])))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=False),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=False),
    dict(type='PackSegInputs'),
]
dataset_type = 'BaseSegDataset'
train_dataloader = dict(
    batch_size=8,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        metainfo=metainfo,
        img_suffix='.jpg',
        seg_map_suffix='.png',
        reduce_zero_label=False,
        data_prefix=dict(img_path='images/train', seg_map_path='seg_maps/train'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        metainfo=metainfo,
        img_suffix='.jpg',
        seg_map_suffix='.png',
        reduce_zero_label=False,
        data_prefix=dict(img_path='images/val', seg_map_path='seg_maps/val'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator

# 1600 iterations of 8 images: about 4.3 epochs. The shape classes' IoU comes in the second
# half, while the cosine schedule brings the learning rate down
max_iters = 1600
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
# foreach: AdamW's update and the gradient norm as a few multi-tensor operations instead of a
# dozen small ones per parameter tensor (the same arithmetic; on a CPU the per-tensor loop took
# about 14 % of this model's iteration in torch.profiler). tools/quickstart.py runs AdamW
# fused instead where the installed torch has that kernel (CUDA; the CPU from torch 2.4)
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1.4e-3, weight_decay=0.01, foreach=True),
    clip_grad=dict(max_norm=10., foreach=True))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='CosineAnnealingLR', eta_min=1e-5, begin=0, end=max_iters, by_epoch=False),
]
default_hooks = dict(
    logger=dict(interval=100),
    checkpoint=dict(by_epoch=False, interval=max_iters, max_keep_ckpts=1))
randomness = dict(seed=0)
