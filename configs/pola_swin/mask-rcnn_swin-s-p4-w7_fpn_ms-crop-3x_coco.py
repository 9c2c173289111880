# Softmax baseline, Swin 3x protocol: Swin-S + Mask R-CNN FPN, COCO 3x multi-scale +
# crop. The -t config of this folder with Swin-S depths and weights, as mmdet derives its
# Swin-S configs. mmdet's own Swin-S 3x config is the AMP variant
# `swin/mask-rcnn_swin-s-p4-w7_fpn_amp-ms-crop-3x_coco.py` (same settings in mixed
# precision); this one stays fp32, like the -t 3x it inherits. Drop path 0.2, as there.
_base_ = './mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

pretrained = 'https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_small_patch4_window7_224.pth'  # noqa
model = dict(
    backbone=dict(depths=[2, 2, 18, 2], init_cfg=dict(type='Pretrained', checkpoint=pretrained)))
