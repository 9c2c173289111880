# Softmax baseline, Swin UperNet Cityscapes protocol (see
# upernet_swin-t_4xb2-80k_cityscapes-512x1024.py): Swin-S + UperNet, Cityscapes 512x1024
# crops, whole-image 1024x2048 evaluation, 4x2, 80k, AdamW lr 6e-5 wd 0.01, drop path 0.3.
# The -t config with Swin-S depths and weights, as mmseg derives its Swin-S configs.
_base_ = './upernet_swin-t_4xb2-80k_cityscapes-512x1024.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

checkpoint_file = 'https://download.openmmlab.com/mmsegmentation/v0.5/pretrain/swin/swin_small_patch4_window7_224_20220317-7ba6d6dd.pth'  # noqa
model = dict(
    backbone=dict(
        init_cfg=dict(type='Pretrained', checkpoint=checkpoint_file), depths=[2, 2, 18, 2]))
