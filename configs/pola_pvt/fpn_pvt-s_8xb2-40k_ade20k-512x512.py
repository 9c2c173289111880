# Softmax baseline, PVT Semantic FPN protocol (see fpn_pvt-t_8xb2-40k_ade20k-512x512.py): PVT
# v1-Small + Semantic FPN, ADE20K 512x512, 8x2 x 40k, AdamW lr 2e-4 wd 1e-4, poly 0.9, drop path
# 0.1 (Agent-Attention's fpn_agent_pvt_s_12-16-28-28.py). Only the backbone differs from -t.
_base_ = './fpn_pvt-t_8xb2-40k_ade20k-512x512.py'

custom_imports = dict(imports=['polaformer_mm', 'mmdet.models'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        num_layers=[3, 4, 6, 3],
        drop_path_rate=0.1,
        init_cfg=dict(checkpoint='https://github.com/whai362/PVT/'
                      'releases/download/v2/pvt_small.pth')))
