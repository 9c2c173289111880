# Pola-PVTv2-B5 + RetinaNet FPN, COCO 1x, PVTv2 protocol: data, schedule and optimizer
# (AdamW lr 1e-4 / 1.4 wd 1e-4, 8x1 images) come from the softmax baseline
# retinanet_pvtv2-b5_fpn_1x_coco.py (= mmdet's PVTv2 RetinaNet); only the backbone is
# swapped. Out channels 64/128/320/512, as the baseline's.
#
# Weights: no official Pola-PVTv2 checkpoint exists. checkpoints/pola_pvtv2_b5_mm.pth is
# the softmax PVTv2-B5 ImageNet file turned into Pola-PVTv2 by the warm-start
# converter (tools/model_converters/softmax2pola.py), or the checkpoint of an ImageNet run of
# Pola-PVTv2-B5 (configs/imagenet/ has recipes for B0-B2 only; see configs/pola_pvtv2/README.md).
# To warm-start from the softmax release while the model is built, use the commented init_cfg.
_base_ = './retinanet_pvtv2-b5_fpn_1x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='PolaPVTv2',
        arch='b5',
        attn_types='LLLL',
        drop_path_rate=0.1,  # as mmdet's PyramidVisionTransformerV2 (the baseline)
        out_indices=(0, 1, 2, 3),
        # warm start from the softmax release instead (see the header):
        # init_cfg=dict(type='WarmStart', checkpoint='https://github.com/whai362/PVT/releases/download/v2/pvt_v2_b5.pth'),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_pvtv2_b5_mm.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))
