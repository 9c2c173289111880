# Softmax baseline, PVT Mask R-CNN 1x protocol (see mask-rcnn_pvt-t_fpn_1x_coco.py): PVT
# v1-Large + Mask R-CNN FPN, COCO 1x, AdamW lr 2e-4 wd 1e-4, drop path 0.2 (Agent-Attention's
# agent_pvt_l_mrcnn_1x_12-16-28-28.py). Only the backbone differs from -t.
_base_ = './mask-rcnn_pvt-t_fpn_1x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        drop_path_rate=0.2,
        num_layers=[3, 8, 27, 3],
        init_cfg=dict(checkpoint='https://github.com/whai362/PVT/'
                      'releases/download/v2/pvt_large.pth')))
