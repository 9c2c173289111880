# Softmax baseline, Swin 3x protocol: mmdet's
# `swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py` (Swin-T + Mask R-CNN FPN, COCO 3x =
# 36 epochs, MultiStep 27/33, multi-scale 480-800 + DETR-style crop, 8x2 images, AdamW lr
# 1e-4 wd 0.05, drop path 0.2, fp32), unchanged but for the extra inert custom_keys below.
# `mask-rcnn_pola-swin-t-p4-w7_fpn_ms-crop-3x_coco.py` inherits this file.
_base_ = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

# Swin protocol optimizer rules, shared by the baseline and the Pola config: upstream's
# custom_keys (no decay for absolute_pos_embed, relative_position_bias_table and every
# 'norm' parameter: norm, norm1, norm2, norm0..3, patch-merging / spatial-reduction norms),
# extended to the other position parameters of our backbones: Pola's positional encoding
# P ('positional_encoding') and PVT's 'pos_embed' (inert for a Swin baseline). Pola's
# learnable 'power' and 'scale' keep weight decay, as in the official classification
# training: its optimizer (Swin codebase set_weight_decay) exempts only 1-D parameters,
# biases and the names in the model's no_weight_decay{,_keywords} (in PolaFormer's
# models/pola_swin.py: absolute_pos_embed / relative_position_bias_table); power
# (1,h,1,d), scale (1,1,C) and positional_encoding (1,n,C) are not 1-D, so the official
# training decays all three. Our dense configs exempt positional_encoding (a position
# table, like relative_position_bias_table) and keep decay on power and scale.
optim_wrapper = dict(
    paramwise_cfg=dict(
        custom_keys={
            'absolute_pos_embed': dict(decay_mult=0.),
            'relative_position_bias_table': dict(decay_mult=0.),
            'norm': dict(decay_mult=0.),
            'positional_encoding': dict(decay_mult=0.),
            'pos_embed': dict(decay_mult=0.),
        }))
