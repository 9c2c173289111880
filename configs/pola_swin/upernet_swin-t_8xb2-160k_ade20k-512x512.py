# Softmax baseline, Swin UperNet protocol: mmseg's
# `swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py`
# (Swin-T + UperNet, ADE20K, 512x512 crops, 8 GPUs x 2 images, 160k iterations, AdamW
# lr 6e-5 wd 0.01, 1500-iter linear warm-up then poly (power 1.0, as upstream), drop path
# 0.3, SyncBN in the heads), unchanged but for the extra inert custom_keys below.
# `upernet_pola-swin-t_8xb2-160k_ade20k-512x512.py` inherits this file and swaps the
# backbone; the -s and -b baselines change the Swin size as mmseg's configs do.
_base_ = 'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(pretrained=None)

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
