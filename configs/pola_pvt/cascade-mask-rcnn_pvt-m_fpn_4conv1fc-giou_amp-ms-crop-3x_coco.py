# Softmax baseline, PVT Cascade 3x protocol (see
# cascade-mask-rcnn_pvt-s_fpn_4conv1fc-giou_amp-ms-crop-3x_coco.py): PVT v1-Medium +
# Cascade Mask R-CNN FPN 4conv1fc GIoU, COCO 3x multi-scale + crop, AdamW lr 1e-4 wd 1e-4,
# mixed precision. Only the backbone differs from -s.
_base_ = './cascade-mask-rcnn_pvt-s_fpn_4conv1fc-giou_amp-ms-crop-3x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        num_layers=[3, 4, 18, 3],
        init_cfg=dict(checkpoint='https://github.com/whai362/PVT/'
                      'releases/download/v2/pvt_medium.pth')))
