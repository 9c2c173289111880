# Softmax baseline, Swin UperNet protocol (see upernet_swin-t_8xb2-160k_ade20k-512x512.py):
# Swin-B (ImageNet-1k weights) + UperNet, ADE20K 512x512, 8x2, 160k, AdamW lr 6e-5 wd 0.01, drop
# path 0.5 (Agent-Attention's upernet_agent_swin_b_9-12-14-7.py; mmseg's Swin-B config keeps
# 0.3). The -t config with the delta of mmseg's
# `swin/swin-base-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py`.
_base_ = './upernet_swin-t_8xb2-160k_ade20k-512x512.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

checkpoint_file = 'https://download.openmmlab.com/mmsegmentation/v0.5/pretrain/swin/swin_base_patch4_window7_224_20220317-e9b98025.pth'  # noqa
model = dict(
    backbone=dict(
        init_cfg=dict(type='Pretrained', checkpoint=checkpoint_file),
        embed_dims=128,
        depths=[2, 2, 18, 2],
        num_heads=[4, 8, 16, 32],
        drop_path_rate=0.5),
    decode_head=dict(in_channels=[128, 256, 512, 1024], num_classes=150),
    auxiliary_head=dict(in_channels=512, num_classes=150))
