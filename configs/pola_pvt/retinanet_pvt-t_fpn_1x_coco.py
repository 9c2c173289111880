# Softmax baseline, PVT RetinaNet 1x protocol: mmdet's `pvt/retinanet_pvt-t_fpn_1x_coco.py` (PVT
# v1-Tiny + RetinaNet FPN, COCO 1x: 12 epochs, MultiStep at 8 and 11, 500-iter linear warm-up, 8
# GPUs x 2 images, 1333x800, AdamW lr 1e-4 wd 1e-4, whai362/PVT's retinanet_pvt_t_fpn_1x_coco.py
# in mmdet 3 form) with the settings of Agent-Attention's
# downstream/detection/configs/agent_pvt/agent_pvt_t_rtn_1x_12-16-28-28.py where they differ:
# drop path 0.1; seed 0. Sources per setting: docs/user_guides/protocol.md.
# `retinanet_pola-pvt-t_fpn_1x_coco.py` inherits this file and swaps the backbone.
_base_ = 'mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(backbone=dict(drop_path_rate=0.1))

randomness = dict(seed=0)
