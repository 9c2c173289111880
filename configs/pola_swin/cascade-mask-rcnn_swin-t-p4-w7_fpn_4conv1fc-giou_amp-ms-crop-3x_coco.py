# Softmax baseline, Swin Cascade 3x protocol: mmdet's
# `convnext/cascade-mask-rcnn_convnext-t-p4-w7_fpn_4conv1fc-giou_amp-ms-crop-3x_coco.py`
# (Cascade Mask R-CNN FPN, three 4conv1fc bbox heads with GIoU loss and SyncBN, COCO 3x =
# 36 epochs, MultiStep 27/33, 1000-iter warm-up, multi-scale 480-800 + DETR-style crop,
# 8x2 images, AdamW, mixed precision) with mmdet's Swin-T backbone (as in
# `swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py`, drop path 0.2) and the Swin
# optimizer of the Swin paper's Cascade 3x: AdamW lr 1e-4 wd 0.05 with the Swin no-decay
# rules below, in place of ConvNeXt's layer-wise lr decay (lr 2e-4, decay 0.7 over its 6
# layers), which reads ConvNeXt parameter names only.
# `cascade-mask-rcnn_pola-swin-t-p4-w7_fpn_4conv1fc-giou_amp-ms-crop-3x_coco.py` inherits
# this file and swaps the backbone; the -s baseline changes the Swin size.
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
        drop_path_rate=0.2,
        patch_norm=True,
        out_indices=(0, 1, 2, 3),
        with_cp=False,
        convert_weights=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 768]))

# Swin protocol optimizer rules, shared by the baseline and the Pola config (see
# mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py): no decay for absolute_pos_embed,
# relative_position_bias_table, every 'norm' parameter, Pola's positional encoding P and
# PVT's 'pos_embed' (inert here); Pola's 'power' and 'scale' keep weight decay.
optim_wrapper = dict(
    type='AmpOptimWrapper',
    constructor='DefaultOptimWrapperConstructor',
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0001, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(
        _delete_=True,
        custom_keys={
            'absolute_pos_embed': dict(decay_mult=0.),
            'relative_position_bias_table': dict(decay_mult=0.),
            'norm': dict(decay_mult=0.),
            'positional_encoding': dict(decay_mult=0.),
            'pos_embed': dict(decay_mult=0.),
        }))
