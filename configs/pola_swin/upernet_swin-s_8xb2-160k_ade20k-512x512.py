# Softmax baseline, Swin UperNet protocol (see upernet_swin-t_8xb2-160k_ade20k-512x512.py):
# Swin-S + UperNet, ADE20K 512x512, 8x2, 160k, AdamW lr 6e-5 wd 0.01, drop path 0.3
# (Agent-Attention's upernet_agent_swin_s_9-12-14-7.py). The -t config with the delta of mmseg's
# `swin/swin-small-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py`.
_base_ = './upernet_swin-t_8xb2-160k_ade20k-512x512.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

checkpoint_file = 'https://download.openmmlab.com/mmsegmentation/v0.5/pretrain/swin/swin_small_patch4_window7_224_20220317-7ba6d6dd.pth'  # noqa
model = dict(
    backbone=dict(
        init_cfg=dict(type='Pretrained', checkpoint=checkpoint_file), depths=[2, 2, 18, 2]),
    decode_head=dict(in_channels=[96, 192, 384, 768], num_classes=150),
    auxiliary_head=dict(in_channels=384, num_classes=150))
