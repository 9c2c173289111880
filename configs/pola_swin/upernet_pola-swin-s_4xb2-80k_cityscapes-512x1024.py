# Pola-Swin-S + UperNet, Cityscapes, Swin UperNet Cityscapes protocol. Data, schedule and
# optimizer (512x1024 crops, whole-image 1024x2048 evaluation, 4x2, 80k, AdamW lr 6e-5 wd 0.01,
# 1500-iter warm-up + poly, custom_keys rules) come from the softmax baseline
# upernet_swin-s_4xb2-80k_cityscapes-512x1024.py; only the backbone is swapped (drop path 0.3;
# out channels [96, 192, 384, 768]). The 'L' stages run over the whole stage map at every size,
# the 1024x2048 evaluation included (docs/user_guides/config.md).
_base_ = './upernet_swin-s_4xb2-80k_cityscapes-512x1024.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='PolaSwin',
        arch='small',
        attn_types='LLSS',
        window_size=7,
        # 'L' stages over the whole stage map (unshifted, unpadded, P resized to the map), as
        # the lineage's dense code runs its linear stages: docs/user_guides/config.md
        linear_window_size=None,
        drop_path_rate=0.3,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_swin_s_mm.pth')),
    decode_head=dict(in_channels=[96, 192, 384, 768]),
    auxiliary_head=dict(in_channels=384))
