# Softmax baseline, Swin Mask R-CNN 1x protocol (see
# mask-rcnn_swin-t-p4-w7_fpn_ms-crop-1x_coco.py): Swin-S + Mask R-CNN FPN, COCO 1x multi-scale +
# crop, AdamW lr 1e-4 wd 0.05, drop path 0.1, float32 (Agent-Attention's
# agent_swin_s_mrcnn_1x_9-12-14-7.py). The -t config with Swin-S depths and weights, as mmdet
# derives its Swin-S configs.
_base_ = './mask-rcnn_swin-t-p4-w7_fpn_ms-crop-1x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

pretrained = 'https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_small_patch4_window7_224.pth'  # noqa
model = dict(
    backbone=dict(depths=[2, 2, 18, 2], init_cfg=dict(type='Pretrained', checkpoint=pretrained)))
