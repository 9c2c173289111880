# Softmax baseline, Swin Mask R-CNN 3x protocol: the settings of Agent-Attention's
# downstream/detection/configs/agent_swin/agent_swin_t_mrcnn_3x_9-12-14-7.py (LeapLabTHU, the
# dense code of PolaFormer's lineage) with mmdet's Swin-T: Mask R-CNN FPN, COCO 3x (36 epochs,
# MultiStep at 27 and 33, 500-iter linear warm-up from 0.001), multi-scale 480-800 + DETR-style
# crop, 8 GPUs x 2 images, AdamW lr 1e-4 wd 0.05 with the no-decay rules below, drop path 0.1,
# float32, seed 0. Model, data and optimizer are mmdet's
# `swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py` (the lineage's pipeline and optimizer in
# mmdet 3 form), with the lineage's drop path (mmdet: 0.2) and warm-up (mmdet: 1000 iterations).
# Sources per setting: docs/user_guides/protocol.md.
#
# `mask-rcnn_pola-swin-t-p4-w7_fpn_ms-crop-3x_coco.py` inherits this file and swaps the
# backbone; the 1x and -s baselines change the schedule and the Swin size.
_base_ = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(backbone=dict(drop_path_rate=0.1))

param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=36, by_epoch=True, milestones=[27, 33], gamma=0.1)
]

# The Swin no-decay rules, shared by the baseline and the Pola config: the lineage's
# custom_keys (absolute_pos_embed, relative_position_bias_table and every 'norm' parameter:
# norm, norm1, norm2, norm0..3, patch-merging norms; Agent-Attention adds its own position
# terms, an_bias ... wa_bias), with Pola's positional encoding P ('positional_encoding') in
# the place of those terms and PVT's 'pos_embed' (both inert for a softmax Swin). Pola's
# learnable 'power' and 'scale' keep weight decay, as in the official classification training
# (its optimizer exempts only 1-D parameters, biases and the relative position tables).
optim_wrapper = dict(
    paramwise_cfg=dict(
        custom_keys={
            'absolute_pos_embed': dict(decay_mult=0.),
            'relative_position_bias_table': dict(decay_mult=0.),
            'norm': dict(decay_mult=0.),
            'positional_encoding': dict(decay_mult=0.),
            'pos_embed': dict(decay_mult=0.),
        }))

randomness = dict(seed=0)
