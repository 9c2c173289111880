# Pola-Swin-S + UperNet, Cityscapes, Swin UperNet Cityscapes protocol. Data, schedule and
# optimizer (512x1024 crops, whole-image 1024x2048 evaluation, 4x2, 80k, AdamW lr 6e-5 wd
# 0.01, 1500-iter warm-up + poly, custom_keys rules) come from the softmax baseline
# upernet_swin-s_4xb2-80k_cityscapes-512x1024.py; only the backbone is swapped (drop path
# 0.3; out channels [96, 192, 384, 768]). At 1024x2048 the official 'L' windows are kept:
# docs/user_guides/config.md compares them with the global form at that size.
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
        linear_window_size=56,  # None: global (docs/user_guides/config.md)
        # windows balanced over the map: no 56x56 window padding 128 to 168 tokens a side
        linear_window_layout='balanced',
        drop_path_rate=0.3,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_swin_s_mm.pth')),
    decode_head=dict(in_channels=[96, 192, 384, 768]),
    auxiliary_head=dict(in_channels=384))
