# Pola-PVT-T + Semantic FPN, ADE20K 512x512, 40k iterations: the softmax baseline
# fpn_pvt-t_8xb2-40k_ade20k-512x512.py (the recipe of Agent-Attention's
# fpn_agent_pvt_t_12-16-28-28.py) with only the backbone swapped for Pola-PVT-T ('LLLL', drop
# path 0.1 as the baseline's, out channels 64/128/320/512). Each setting with its source:
# docs/user_guides/protocol.md.
_base_ = './fpn_pvt-t_8xb2-40k_ade20k-512x512.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='PolaPVT',
        arch='tiny',
        attn_types='LLLL',
        drop_path_rate=0.1,  # fpn_agent_pvt_t, as the baseline
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_pvt_t_mm.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))
