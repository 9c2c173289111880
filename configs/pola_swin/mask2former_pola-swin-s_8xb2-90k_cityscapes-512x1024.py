# Pola-Swin-S + Mask2Former, Cityscapes, 512x1024 crops, whole-image 1024x2048 evaluation, 8x2
# images, 90k iterations, AdamW lr 1e-4 wd 0.05 with backbone lr x0.1, poly 0.9, gradient clip
# 0.01, drop path 0.3; Mask2Former Swin protocol. Data, heads, schedule and optimizer (with the
# custom_keys rules) come from the softmax baseline
# mask2former_swin-s_8xb2-90k_cityscapes-512x1024.py; only the backbone is swapped (drop path
# 0.3 and out channels 96/192/384/768, as there).
_base_ = './mask2former_swin-s_8xb2-90k_cityscapes-512x1024.py'

custom_imports = dict(imports=['polaformer_mm', 'mmdet.models'], allow_failed_imports=False)

model = dict(
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
    decode_head=dict(in_channels=[96, 192, 384, 768]))
