# Pola-PVT-T + Semantic FPN, ADE20K, PVT Semantic-FPN protocol (PolaFormer paper,
# Semantic FPN with Pola-PVT): data, schedule and optimizer (512x512, 16 x 80k, AdamW
# lr 1e-4 wd 1e-4, poly 0.9) come from the softmax baseline
# fpn_pvt-t_4xb4-80k_ade20k-512x512.py; only the backbone is swapped.
_base_ = './fpn_pvt-t_4xb4-80k_ade20k-512x512.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='PolaPVT',
        arch='tiny',
        attn_types='LLLL',
        drop_path_rate=0.1,  # as mmdet's PVT (the baseline) and official PVT dense backbones
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_pvt_t_mm.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))
