# Softmax baseline, PVT Semantic-FPN Cityscapes protocol (see
# fpn_pvt-t_4xb2-80k_cityscapes-512x1024.py): PVT v1-Medium + Semantic FPN, Cityscapes
# 512x1024 crops, whole-image 1024x2048 evaluation, 4x2, 80k, AdamW lr 1e-4 wd 1e-4, poly
# 0.9. Only the backbone differs from -t.
_base_ = './fpn_pvt-t_4xb2-80k_cityscapes-512x1024.py'

custom_imports = dict(imports=['polaformer_mm', 'mmdet.models'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        num_layers=[3, 4, 18, 3],
        init_cfg=dict(checkpoint='https://github.com/whai362/PVT/'
                      'releases/download/v2/pvt_medium.pth')))
