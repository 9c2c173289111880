# Softmax baseline, Swin Cascade Mask R-CNN 3x protocol: the settings of Agent-Attention's
# downstream/detection/configs/agent_swin/agent_swin_t_crcnn_3x_9-12-14-7.py with mmdet's
# Swin-T: Cascade Mask R-CNN FPN with three 4conv1fc bbox heads (GIoU loss, SyncBN), COCO 3x (36
# epochs, MultiStep at 27 and 33, 500-iter linear warm-up), multi-scale 480-800 + DETR-style
# crop, 8 GPUs x 2 images, AdamW lr 1e-4 wd 0.05 with the Swin no-decay rules below, drop path
# 0.1, float32, seed 0. Model, heads and data are mmdet's
# `convnext/cascade-mask-rcnn_convnext-t-p4-w7_fpn_4conv1fc-giou_amp-ms-crop-3x_coco.py` (the
# lineage's heads and pipeline in mmdet 3 form), with the Swin optimizer in place of ConvNeXt's
# layer-wise lr decay (which reads ConvNeXt parameter names only), float32 in place of its mixed
# precision and the lineage's 500-iter warm-up in place of its 1000. Sources per setting:
# docs/user_guides/protocol.md.
#
# `cascade-mask-rcnn_pola-swin-t-p4-w7_fpn_4conv1fc-giou_ms-crop-3x_coco.py` inherits this file
# and swaps the backbone; the -s baseline changes the Swin size.
_base_ = 'mmdet::convnext/cascade-mask-rcnn_convnext-t-p4-w7_fpn_4conv1fc-giou_amp-ms-crop-3x_coco.py'  # noqa

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

pretrained = 'https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_tiny_patch4_window7_224.pth'  # noqa
model = dict(
    backbone=dict(
        _delete_=True,
        type='SwinTransformer',
        embed_dims=96,
        depths=[2, 2, 6, 2],
        num_heads=[3, 6, 12, 24],
        window_size=7,
        mlp_ratio=4,
        qkv_bias=True,
        qk_scale=None,
        drop_rate=0.,
        attn_drop_rate=0.,
        drop_path_rate=0.1,
        patch_norm=True,
        out_indices=(0, 1, 2, 3),
        with_cp=False,
        convert_weights=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 768]))

param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=36, by_epoch=True, milestones=[27, 33], gamma=0.1)
]

# The Swin no-decay rules of mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py (Pola's positional
# encoding in the place of Agent-Attention's position terms; 'pos_embed' inert here); Pola's
# 'power' and 'scale' keep weight decay.
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.0001, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(
        custom_keys={
            'absolute_pos_embed': dict(decay_mult=0.),
            'relative_position_bias_table': dict(decay_mult=0.),
            'norm': dict(decay_mult=0.),
            'positional_encoding': dict(decay_mult=0.),
            'pos_embed': dict(decay_mult=0.),
        }))

randomness = dict(seed=0)
