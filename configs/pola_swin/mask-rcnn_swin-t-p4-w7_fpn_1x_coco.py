# Softmax baseline, Swin protocol: mmdet's `swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py`
# (Swin-T + Mask R-CNN FPN, COCO 1x = 12 epochs, MultiStep 8/11, 1000-iter warm-up, 8x2
# images, 1333x800, AdamW lr 1e-4 wd 0.05, drop path 0.2), unchanged but for the extra
# inert custom_keys below. `mask-rcnn_pola-swin-t-p4-w7_fpn_1x_coco.py` inherits this
# file and swaps the backbone; `mask-rcnn_swin-s-p4-w7_fpn_1x_coco.py` changes the depths.
_base_ = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'

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
