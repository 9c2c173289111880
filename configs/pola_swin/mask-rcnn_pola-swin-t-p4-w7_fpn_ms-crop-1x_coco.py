# Pola-Swin-T + Mask R-CNN FPN, COCO 1x with multi-scale crops: the softmax baseline
# mask-rcnn_swin-t-p4-w7_fpn_ms-crop-1x_coco.py (the recipe of Agent-Attention's
# agent_swin_t_mrcnn_1x_9-12-14-7.py) with only the backbone swapped for Pola-Swin-T ('LLSS',
# the 'L' stages over the whole map, drop path 0.1 as the baseline's, out channels
# 96/192/384/768). Each setting with its source: docs/user_guides/protocol.md.
_base_ = './mask-rcnn_swin-t-p4-w7_fpn_ms-crop-1x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='PolaSwin',
        arch='tiny',
        attn_types='LLSS',
        window_size=7,
        # 'L' stages over the whole stage map (unshifted, unpadded, P resized to the map), as
        # the lineage's dense code runs its linear stages: docs/user_guides/config.md
        linear_window_size=None,
        drop_path_rate=0.1,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_swin_t_mm.pth')),
    neck=dict(in_channels=[96, 192, 384, 768]))
