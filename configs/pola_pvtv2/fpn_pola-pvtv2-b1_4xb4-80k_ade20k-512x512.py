# Pola-PVTv2-B1 + Semantic FPN, ADE20K, PVT Semantic-FPN protocol: data, schedule and
# optimizer (512x512, 16 x 80k, AdamW lr 1e-4 wd 1e-4, poly 0.9) come from the softmax
# baseline fpn_pvtv2-b1_4xb4-80k_ade20k-512x512.py; only the backbone is swapped.
#
# Weights: no official Pola-PVTv2 checkpoint exists. checkpoints/pola_pvtv2_b1_mm.pth is
# the softmax PVTv2-B1 ImageNet file turned into Pola-PVTv2 by the warm-start
# converter (tools/model_converters/softmax2pola.py), or the checkpoint of an ImageNet run of
# configs/imagenet/pola-pvtv2-b1_8xb128_in1k.py (see configs/pola_pvtv2/README.md). To
# warm-start from the softmax release while the model is built, use the commented init_cfg.
_base_ = './fpn_pvtv2-b1_4xb4-80k_ade20k-512x512.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='PolaPVTv2',
        arch='b1',
        attn_types='LLLL',
        drop_path_rate=0.1,  # as mmdet's PyramidVisionTransformerV2 (the baseline)
        out_indices=(0, 1, 2, 3),
        # warm start from the softmax release instead (see the header):
        # init_cfg=dict(type='WarmStart', checkpoint='https://github.com/whai362/PVT/releases/download/v2/pvt_v2_b1.pth'),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_pvtv2_b1_mm.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))
