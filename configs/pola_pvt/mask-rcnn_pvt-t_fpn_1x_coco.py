# Softmax baseline, PVT Mask R-CNN 1x protocol: the settings of Agent-Attention's
# downstream/detection/configs/agent_pvt/agent_pvt_t_mrcnn_1x_12-16-28-28.py (LeapLabTHU, the
# dense code of PolaFormer's lineage) with PVT v1-Tiny (mmdet `PyramidVisionTransformer`): Mask
# R-CNN FPN, COCO 1x (12 epochs, MultiStep at 8 and 11, 500-iter linear warm-up from 0.001), 8
# GPUs x 2 images, 1333x800 single scale with flips, AdamW lr 2e-4 wd 1e-4 with no paramwise
# rules, drop path 0.1 (S 0.2, M 0.1, L 0.2: the -s/-m/-l files), float32, seed 0. whai362/PVT's
# own Mask R-CNN configs also use lr 2e-4. Model, data and schedule are mmdet's
# `mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py` (the lineage's mmdet 2 bases, in mmdet 3 form);
# setting by setting with sources: docs/user_guides/protocol.md.
#
# This file carries the protocol: `mask-rcnn_pola-pvt-t_fpn_1x_coco.py` inherits it and swaps
# only the backbone; the s/m/l baselines inherit it and change only the backbone.
_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='PyramidVisionTransformer',
        num_layers=[2, 2, 2, 2],
        drop_path_rate=0.1,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='https://github.com/whai362/PVT/'
            'releases/download/v2/pvt_tiny.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))

optim_wrapper = dict(optimizer=dict(_delete_=True, type='AdamW', lr=0.0002, weight_decay=0.0001))

randomness = dict(seed=0)
