# Softmax baseline, PVT protocol: mmdet's `pvt/retinanet_pvt-s_fpn_1x_coco.py` unchanged
# (PVT v1-Small + RetinaNet FPN, COCO 1x, 8x2 images, 1333x800, AdamW lr 1e-4 wd 1e-4,
# PVT paper / whai362/PVT detection/configs/retinanet_pvt_s_fpn_1x_coco.py).
# `retinanet_pola-pvt-s_fpn_1x_coco.py` inherits this file and swaps the backbone.
_base_ = 'mmdet::pvt/retinanet_pvt-s_fpn_1x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)
