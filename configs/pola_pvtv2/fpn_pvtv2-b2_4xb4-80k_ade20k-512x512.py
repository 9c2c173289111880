# Softmax baseline, PVT Semantic-FPN protocol (see fpn_pvtv2-b0_4xb4-80k_ade20k-512x512.py):
# PVTv2-B2 + Semantic FPN, ADE20K 512x512, 16 x 80k, AdamW lr 1e-4 wd 1e-4, poly 0.9.
# Only the backbone and the neck's input channels differ from -b0.
_base_ = './fpn_pvtv2-b0_4xb4-80k_ade20k-512x512.py'

custom_imports = dict(imports=['polaformer_mm', 'mmdet.models'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        embed_dims=64,
        num_layers=[3, 4, 6, 3],
        init_cfg=dict(checkpoint='https://github.com/whai362/PVT/'
                      'releases/download/v2/pvt_v2_b2.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))
