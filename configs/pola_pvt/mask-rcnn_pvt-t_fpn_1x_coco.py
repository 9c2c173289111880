# Softmax baseline, PVT protocol: PVT v1-Tiny (mmdet `PyramidVisionTransformer`) +
# Mask R-CNN FPN, COCO, 1x (12 epochs, MultiStep at 8 and 11, 500-iter linear warm-up),
# 8 GPUs x 2 images, 1333x800, AdamW lr 1e-4, wd 1e-4, no paramwise rules.
#
# Mask R-CNN with PVT is not in mmdet: this is mmdet's
# `mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py` with the backbone and the optimizer of mmdet's
# `pvt/retinanet_pvt-t_fpn_1x_coco.py` (the PVT paper's detection setting). NOTE: the
# official PVT repo's Mask R-CNN configs (whai362/PVT detection/configs/
# mask_rcnn_pvt_*_fpn_1x_coco.py) use lr 2e-4; we keep the paper's 1e-4 for both heads.
#
# This file carries the protocol: `mask-rcnn_pola-pvt-t_fpn_1x_coco.py` inherits it and
# swaps only the backbone; the s/m/l baselines inherit it and change only the backbone.
_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='PyramidVisionTransformer',
        num_layers=[2, 2, 2, 2],
        init_cfg=dict(
            type='Pretrained',
            checkpoint='https://github.com/whai362/PVT/'
            'releases/download/v2/pvt_tiny.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))

optim_wrapper = dict(optimizer=dict(_delete_=True, type='AdamW', lr=0.0001, weight_decay=0.0001))
