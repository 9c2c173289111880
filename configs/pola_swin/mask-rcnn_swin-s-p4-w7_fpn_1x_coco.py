# Softmax baseline, Swin protocol: Swin-S + Mask R-CNN FPN, COCO 1x. The -t config of
# this folder with Swin-S depths and weights, as mmdet derives its Swin-S configs. There
# is no Swin-S 1x config upstream; drop path stays 0.2, as in mmdet's Swin-S 3x.
_base_ = './mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

pretrained = 'https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_small_patch4_window7_224.pth'  # noqa
model = dict(
    backbone=dict(depths=[2, 2, 18, 2], init_cfg=dict(type='Pretrained', checkpoint=pretrained)))
