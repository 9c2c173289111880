# Softmax baseline, PVTv2 protocol (see mask-rcnn_pvtv2-b0_fpn_1x_coco.py): PVTv2-B3
# + Mask R-CNN FPN, COCO 1x, AdamW lr 1e-4 wd 1e-4. Only the backbone (the delta of mmdet's
# `pvt/retinanet_pvtv2-b3_fpn_1x_coco.py`) and the neck's input channels differ from -b0.
_base_ = './mask-rcnn_pvtv2-b0_fpn_1x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        embed_dims=64,
        num_layers=[3, 4, 18, 3],
        init_cfg=dict(checkpoint='https://github.com/whai362/PVT/'
                      'releases/download/v2/pvt_v2_b3.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))
