# Softmax baseline, PVTv2 protocol: PVTv2-B0 (mmdet `PyramidVisionTransformerV2`) +
# Mask R-CNN FPN, COCO, 1x (12 epochs, MultiStep at 8 and 11, 500-iter linear warm-up),
# 8 GPUs x 2 images, 1333x800, AdamW lr 1e-4, wd 1e-4, drop path 0.1, no paramwise rules.
#
# Mask R-CNN with PVTv2 is not in mmdet: this is mmdet's
# `mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py` with the backbone and the optimizer of mmdet's
# `pvt/retinanet_pvtv2-b0_fpn_1x_coco.py` (the PVTv2 paper's detection setting), as
# configs/pola_pvt/mask-rcnn_pvt-t_fpn_1x_coco.py does for PVT. NOTE: the PVT repository's
# PVTv2 Mask R-CNN configs (whai362/PVT detection/configs/mask_rcnn_pvt_v2_*_fpn_1x_coco.py)
# use lr 2e-4; we keep mmdet's PVTv2 lr 1e-4 for both heads.
#
# This file carries the protocol: `mask-rcnn_pola-pvtv2-b0_fpn_1x_coco.py` inherits it and
# swaps only the backbone; the b1/b2 baselines inherit it and change only the backbone.
_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='PyramidVisionTransformerV2',
        embed_dims=32,
        num_layers=[2, 2, 2, 2],
        init_cfg=dict(
            type='Pretrained',
            checkpoint='https://github.com/whai362/PVT/'
            'releases/download/v2/pvt_v2_b0.pth')),
    neck=dict(in_channels=[32, 64, 160, 256]))

optim_wrapper = dict(optimizer=dict(_delete_=True, type='AdamW', lr=0.0001, weight_decay=0.0001))

randomness = dict(seed=0)
