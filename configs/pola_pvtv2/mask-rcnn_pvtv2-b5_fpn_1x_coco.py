# Softmax baseline, PVTv2 protocol (see mask-rcnn_pvtv2-b0_fpn_1x_coco.py): PVTv2-B5
# + Mask R-CNN FPN, COCO 1x, AdamW lr 1e-4 / 1.4 wd 1e-4, 8x1 images. The backbone is the
# delta of mmdet's `pvt/retinanet_pvtv2-b5_fpn_1x_coco.py`, and so are the optimizer, the batch
# (8 GPUs x 1 image) and `auto_scale_lr` (base batch 8) that mmdet gives PVTv2-B5; the neck's
# input channels differ from -b0 as well.
_base_ = './mask-rcnn_pvtv2-b0_fpn_1x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        embed_dims=64,
        num_layers=[3, 6, 40, 3],
        mlp_ratios=(4, 4, 4, 4),
        init_cfg=dict(checkpoint='https://github.com/whai362/PVT/'
                      'releases/download/v2/pvt_v2_b5.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))

# as mmdet's PVTv2-B5 RetinaNet: lr 1e-4 / 1.4 at 8 GPUs x 1 image
optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0001 / 1.4, weight_decay=0.0001))
train_dataloader = dict(batch_size=1, num_workers=1)
auto_scale_lr = dict(base_batch_size=8)
