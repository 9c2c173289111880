# Pola-Swin-T + UperNet, ADE20K 512x512, 160k iterations: the softmax baseline
# upernet_swin-t_8xb2-160k_ade20k-512x512.py (the recipe of Agent-Attention's
# upernet_agent_swin_t_9-12-14-7.py) with only the backbone swapped for Pola-Swin-T ('LLSS', the
# 'L' stages over the whole map, drop path 0.3 as the baseline's, out channels 96/192/384/768).
# Each setting with its source: docs/user_guides/protocol.md.
_base_ = './upernet_swin-t_8xb2-160k_ade20k-512x512.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='PolaSwin',
        arch='tiny',
        attn_types='LLSS',
        window_size=7,
        # 'L' stages over the whole stage map (unshifted, unpadded, P resized to the map), as
        # the lineage's dense code runs its linear stages: docs/user_guides/config.md
        linear_window_size=None,
        drop_path_rate=0.3,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_swin_t_mm.pth')),
    decode_head=dict(in_channels=[96, 192, 384, 768]),
    auxiliary_head=dict(in_channels=384))
