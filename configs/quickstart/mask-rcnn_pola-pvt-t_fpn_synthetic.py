# Quickstart: Mask R-CNN + Pola-PVT-T trained from scratch on the bundled synthetic data
# (tools/dataset_converters/generate_synthetic_data.py; circles, squares and triangles on
# textured 128x128 backgrounds). Not a paper protocol: a light Mask R-CNN (128-channel FPN,
# 128 sampled RoIs, 300 proposals) so that it learns within minutes on 2 CPU cores.
# `make quickstart` (tools/quickstart.py) generates the data, trains, evaluates with the
# real CocoMetric and writes prediction images. Delta over mmdet's Mask R-CNN R-50 FPN 1x.
_base_ = ['mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py']
custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

data_root = 'data/synthetic/'
metainfo = dict(
    classes=('circle', 'square', 'triangle'), palette=[(220, 20, 60), (0, 130, 255), (255, 190, 0)])
num_classes = 3
img_scale = (128, 128)
fpn_channels = 128
norm_cfg = dict(type='GN', num_groups=32, requires_grad=True)

model = dict(
    data_preprocessor=dict(pad_size_divisor=32),
    backbone=dict(
        _delete_=True,
        type='PolaPVT',
        arch='tiny',
        attn_types='LLLL',
        drop_path_rate=0.,
        out_indices=(0, 1, 2, 3),
        init_cfg=None),  # from scratch: no ImageNet weights are needed
    # GroupNorm in the neck and the mask head, as mmdet's from-scratch recipe
    # (configs/scratch): the backbone's raw stage maps grow in magnitude from a random
    # start, and without it the mask logits start far off and training is unstable
    neck=dict(in_channels=[64, 128, 320, 512], out_channels=fpn_channels, norm_cfg=norm_cfg),
    # the shapes are 15-60 px: anchors from 16 px (stride 4) instead of 32 px
    rpn_head=dict(
        in_channels=fpn_channels, feat_channels=fpn_channels, anchor_generator=dict(scales=[4])),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=fpn_channels),
        bbox_head=dict(in_channels=fpn_channels, fc_out_channels=256, num_classes=num_classes),
        mask_roi_extractor=dict(out_channels=fpn_channels),
        mask_head=dict(
            in_channels=fpn_channels,
            conv_out_channels=fpn_channels,
            num_classes=num_classes,
            norm_cfg=norm_cfg)),
    train_cfg=dict(
        rpn=dict(sampler=dict(num=128)),
        rpn_proposal=dict(nms_pre=1000, max_per_img=300),
        rcnn=dict(sampler=dict(num=128))),
    test_cfg=dict(rpn=dict(nms_pre=600, max_per_img=300), rcnn=dict(max_per_img=50)))

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
    batch_size=4,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/instances_train.json',
        data_prefix=dict(img='images/train/'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=4,
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

max_epochs = 6
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=100),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[5], gamma=0.1),
]
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=2e-4, weight_decay=1e-4),
    clip_grad=dict(max_norm=10.))
default_hooks = dict(
    logger=dict(interval=25), checkpoint=dict(interval=max_epochs, max_keep_ckpts=1))
randomness = dict(seed=0)
auto_scale_lr = dict(enable=False, base_batch_size=4)
