# Softmax baseline, PVTv2 protocol: mmdet's `pvt/retinanet_pvtv2-b3_fpn_1x_coco.py` unchanged
# (PVTv2-B3 + RetinaNet FPN, COCO 1x, 8x2 images, 1333x800, AdamW lr 1e-4 wd 1e-4, drop path
# 0.1; PVTv2 paper / whai362/PVT detection/configs/retinanet_pvt_v2_b3_fpn_1x_coco.py).
# `retinanet_pola-pvtv2-b3_fpn_1x_coco.py` inherits this file and swaps the backbone.
_base_ = 'mmdet::pvt/retinanet_pvtv2-b3_fpn_1x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

randomness = dict(seed=0)
