# Softmax baseline, Swin Cascade Mask R-CNN 3x protocol (see
# cascade-mask-rcnn_swin-t-p4-w7_fpn_4conv1fc-giou_ms-crop-3x_coco.py): Swin-S + Cascade Mask
# R-CNN FPN 4conv1fc GIoU, COCO 3x multi-scale + crop, AdamW lr 1e-4 wd 0.05, drop path 0.1,
# float32 (Agent-Attention's agent_swin_s_crcnn_3x_9-12-14-7.py). The -t config with Swin-S
# depths and weights, as mmdet derives its Swin-S configs.
_base_ = './cascade-mask-rcnn_swin-t-p4-w7_fpn_4conv1fc-giou_ms-crop-3x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

pretrained = 'https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_small_patch4_window7_224.pth'  # noqa
model = dict(
    backbone=dict(depths=[2, 2, 18, 2], init_cfg=dict(type='Pretrained', checkpoint=pretrained)))
