# Softmax baseline, PVT Cascade 3x protocol: mmdet's
# `convnext/cascade-mask-rcnn_convnext-t-p4-w7_fpn_4conv1fc-giou_amp-ms-crop-3x_coco.py`
# (Cascade Mask R-CNN FPN, three 4conv1fc bbox heads with GIoU loss and SyncBN, COCO 3x = 36
# epochs, MultiStep 27/33, 1000-iter warm-up, multi-scale 480-800 + DETR-style crop, 8x2 images,
# mixed precision) with PVT v1-Small (mmdet `PyramidVisionTransformer`, drop path 0.1) and the
# PVT RetinaNet optimizer of this folder: AdamW lr 1e-4 wd 1e-4, no paramwise rules (the lineage
# has no Cascade config for PVT), in place of ConvNeXt's layer-wise lr decay (which reads
# ConvNeXt parameter names only).
# `cascade-mask-rcnn_pola-pvt-s_fpn_4conv1fc-giou_amp-ms-crop-3x_coco.py` inherits this file and
# swaps the backbone; the -m baseline changes the PVT size.
_base_ = 'mmdet::convnext/cascade-mask-rcnn_convnext-t-p4-w7_fpn_4conv1fc-giou_amp-ms-crop-3x_coco.py'  # noqa

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='PyramidVisionTransformer',
        num_layers=[3, 4, 6, 3],
        init_cfg=dict(
            type='Pretrained',
            checkpoint='https://github.com/whai362/PVT/'
            'releases/download/v2/pvt_small.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))

optim_wrapper = dict(
    _delete_=True,
    type='AmpOptimWrapper',
    optimizer=dict(type='AdamW', lr=0.0001, betas=(0.9, 0.999), weight_decay=0.0001))

randomness = dict(seed=0)
