# Quickstart: Mask R-CNN + Pola-PVT-nano trained from scratch on the bundled synthetic data
# (polaformer_mm.datasets.synthetic: 3000 + 200 images of 64x64 with upright circles, squares
# and triangles partly occluding each other, on textured backgrounds; COCO JSON with polygon
# masks). Not a paper protocol: a light Mask R-CNN (64-channel FPN, 32 sampled RoIs per image,
# 50 proposals, anchors from 16 px) so that it runs within minutes on 2 CPU cores.
# `make quickstart` (tools/quickstart.py) generates the data, trains, evaluates with the real
# CocoMetric and draws predictions. Delta over mmdet's Mask R-CNN R-50 FPN 1x.
_base_ = ['mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py']
custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

data_root = 'data/synthetic/'
metainfo = dict(
    classes=('circle', 'square', 'triangle'), palette=[(220, 20, 60), (0, 130, 255), (255, 190, 0)])
num_classes = 3
img_size = 64
img_scale = (img_size, img_size)
channels = 64  # FPN and head width
norm_cfg = dict(type='GN', num_groups=16, requires_grad=True)
backbone_dims = [32, 64, 160, 256]  # PolaPVT arch 'nano'

model = dict(
    data_preprocessor=dict(pad_size_divisor=32),
    backbone=dict(
        _delete_=True,
        type='PolaPVT',
        arch='nano',
        attn_types='LLLL',  # COMPARE=1 trains 'SSSS' (PVT softmax attention) beside it
        pretrain_img_size=img_size,  # the positional encodings are learned at this size
        drop_path_rate=0.,
        out_indices=(0, 1, 2, 3),
        init_cfg=None),  # from scratch: no ImageNet weights are needed
    # GroupNorm in the neck and the mask head, as mmdet's from-scratch recipe (configs/scratch):
    # the raw stage maps of a randomly initialised backbone grow in magnitude, and without it
    # the mask logits start far off and training is unstable
    neck=dict(in_channels=backbone_dims, out_channels=channels, norm_cfg=norm_cfg),
    # the shapes are 13-32 px: anchors from 16 px (stride 4) instead of 32 px
    rpn_head=dict(in_channels=channels, feat_channels=channels, anchor_generator=dict(scales=[4])),
    # RoIAlign on a CPU (mmcv's op) is about a quarter of an iteration at mmdet's defaults:
    # one sample per bin, and 7x7 mask RoIs (14x14 mask targets, for shapes of 13-32 px)
    # instead of 14x14 (28x28) take about a quarter off each iteration and keep the metrics
    # (measured with synthetic data of rotated shapes, generator version 3, 4 epochs, seed 0:
    # bbox mAP 0.543 / mAP@50 0.730, segm mAP 0.565, against 0.536 / 0.738 / 0.579 at the
    # defaults)
    roi_head=dict(
        bbox_roi_extractor=dict(
            out_channels=channels, roi_layer=dict(output_size=7, sampling_ratio=1)),
        bbox_head=dict(in_channels=channels, fc_out_channels=256, num_classes=num_classes),
        mask_roi_extractor=dict(
            out_channels=channels, roi_layer=dict(output_size=7, sampling_ratio=1)),
        mask_head=dict(
            roi_feat_size=7,
            num_convs=2,
            in_channels=channels,
            conv_out_channels=channels,
            num_classes=num_classes,
            norm_cfg=norm_cfg)),
    train_cfg=dict(
        rpn=dict(sampler=dict(num=128)),
        # 1-4 objects per image: 200 boxes per level into the NMS and 50 proposals out of it
        # (mmdet's 2000 / 1000, the quickstart's earlier 500 / 100); the proposal step took
        # a quarter of the forward pass at 500 / 100
        rpn_proposal=dict(nms_pre=200, max_per_img=50),
        # 32 RoIs per image (of which up to 8 positive) hold every object of these 1-4 shape
        # images and cost two thirds of 64's time per iteration: 4 epochs of 32 learn more
        # than 3 of 64 in the same time (measured as above: bbox mAP 0.54 vs 0.45)
        rcnn=dict(sampler=dict(num=32), mask_size=14)),
    test_cfg=dict(rpn=dict(nms_pre=500, max_per_img=100), rcnn=dict(max_per_img=20)))

train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=8,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/instances_train.json',
        data_prefix=dict(img='images/train/'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=8,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/instances_val.json',
        data_prefix=dict(img='images/val/'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator

max_epochs = 2  # 750 iterations of 8 images
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=100),
    dict(
        type='CosineAnnealingLR',
        by_epoch=True,
        begin=0,
        end=max_epochs,
        eta_min_ratio=0.01,
        convert_to_iter_based=True),
]
# foreach: AdamW's update and the gradient norm as multi-tensor operations (the same
# arithmetic, fewer small operations per iteration); tools/quickstart.py runs AdamW fused
# instead where the installed torch has that kernel (CUDA; the CPU from torch 2.4)
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05, foreach=True),
    clip_grad=dict(max_norm=10., foreach=True))
default_hooks = dict(
    logger=dict(interval=100), checkpoint=dict(interval=max_epochs, max_keep_ckpts=1))
randomness = dict(seed=0)
auto_scale_lr = dict(enable=False, base_batch_size=8)
