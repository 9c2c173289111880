# Softmax baseline, Swin UperNet Cityscapes protocol: mmseg's
# `upernet/upernet_r50_4xb2-80k_cityscapes-512x1024.py` (UperNet, Cityscapes, 512x1024
# crops of images resized to 2048x1024 x 0.5-2.0, whole-image 1024x2048 evaluation, 4 GPUs
# x 2 images, mmseg's 80k schedule: 80k iterations, validation and checkpoint every 8k,
# SyncBN in the heads) with mmseg's Swin-T backbone and the Swin UperNet optimizer of
# `swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py` over the 80k
# iterations (AdamW lr 6e-5 wd 0.01, 1500-iter linear warm-up then poly power 1.0 to 0,
# drop path 0.3) in place of the ResNet's SGD, with the Swin no-decay rules below.
# `upernet_pola-swin-t_4xb2-80k_cityscapes-512x1024.py` inherits this file and swaps the
# backbone; the -s baseline changes the Swin size.
_base_ = 'mmseg::upernet/upernet_r50_4xb2-80k_cityscapes-512x1024.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

checkpoint_file = 'https://download.openmmlab.com/mmsegmentation/v0.5/pretrain/swin/swin_tiny_patch4_window7_224_20220317-1cdeb081.pth'  # noqa
model = dict(
    pretrained=None,  # the base sets open-mmlab://resnet50_v1c
    backbone=dict(
        _delete_=True,
        type='SwinTransformer',
        pretrain_img_size=224,
        embed_dims=96,
        patch_size=4,
        window_size=7,
        mlp_ratio=4,
        depths=[2, 2, 6, 2],
        num_heads=[3, 6, 12, 24],
        strides=(4, 2, 2, 2),
        out_indices=(0, 1, 2, 3),
        qkv_bias=True,
        qk_scale=None,
        patch_norm=True,
        drop_rate=0.,
        attn_drop_rate=0.,
        drop_path_rate=0.3,
        use_abs_pos_embed=False,
        act_cfg=dict(type='GELU'),
        norm_cfg=dict(type='LN', requires_grad=True),
        init_cfg=dict(type='Pretrained', checkpoint=checkpoint_file)),
    decode_head=dict(in_channels=[96, 192, 384, 768]),
    auxiliary_head=dict(in_channels=384))

# Swin protocol optimizer rules, shared by the baseline and the Pola config (see
# upernet_swin-t_8xb2-160k_ade20k-512x512.py): no decay for absolute_pos_embed,
# relative_position_bias_table, every 'norm' parameter, Pola's positional encoding P and
# PVT's 'pos_embed' (inert here); Pola's 'power' and 'scale' keep weight decay.
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.00006, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(
        custom_keys={
            'absolute_pos_embed': dict(decay_mult=0.),
            'relative_position_bias_table': dict(decay_mult=0.),
            'norm': dict(decay_mult=0.),
            'positional_encoding': dict(decay_mult=0.),
            'pos_embed': dict(decay_mult=0.),
        }))

param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=80000, by_epoch=False)
]

randomness = dict(seed=0)
