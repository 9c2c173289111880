# Pola-Swin-T + UperNet, ADE20K, Swin UperNet protocol (PolaFormer paper,
# UperNet 160k with Pola-Swin). Data, schedule and optimizer (512x512, 8x2, 160k, AdamW
# lr 6e-5 wd 0.01, 1500-iter warm-up + poly, custom_keys rules) come from the softmax
# baseline upernet_swin-t_8xb2-160k_ade20k-512x512.py; only the backbone is swapped
# (drop path 0.3 as mmseg's Swin UperNet; out channels [96, 192, 384, 768]).
_base_ = './upernet_swin-t_8xb2-160k_ade20k-512x512.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='PolaSwin',
        arch='tiny',
        attn_types='LLSS',
        window_size=7,
        linear_window_size=56,  # None: global (docs/user_guides/config.md)
        # windows balanced over the map: no 56x56 window padding 128 to 168 tokens a side
        linear_window_layout='balanced',
        drop_path_rate=0.3,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_swin_t_mm.pth')),
    decode_head=dict(in_channels=[96, 192, 384, 768]),
    auxiliary_head=dict(in_channels=384))
