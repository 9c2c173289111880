# Softmax baseline, Mask2Former Swin protocol: mmseg's
# `mask2former/mask2former_swin-t_8xb2-90k_cityscapes-512x1024.py` (Swin-T + Mask2Former,
# Cityscapes, 512x1024 crops, whole-image 1024x2048 evaluation, 8x2 images, 90k iterations,
# AdamW lr 1e-4 wd 0.05 with backbone lr x0.1, poly 0.9, gradient clip 0.01, drop path 0.3),
# unchanged but for the extra inert custom_keys below.
# `mask2former_pola-swin-t_8xb2-90k_cityscapes-512x1024.py` inherits this file and swaps the
# backbone.
_base_ = 'mmseg::mask2former/mask2former_swin-t_8xb2-90k_cityscapes-512x1024.py'  # noqa

custom_imports = dict(imports=['polaformer_mm', 'mmdet.models'], allow_failed_imports=False)

# Upstream's rules (backbone lr x0.1; no decay for its norms, absolute_pos_embed,
# relative_position_bias_table and the query / level embeddings), extended to the other
# position parameters of our backbones, as in every Swin-protocol config of this folder:
# Pola's positional encoding P ('positional_encoding') and PVT's 'pos_embed' (inert for a
# Swin baseline) get the backbone embeddings' lr x0.1 and no decay. Pola's 'power' and
# 'scale' keep weight decay (the 'backbone' rule).
optim_wrapper = dict(
    paramwise_cfg=dict(
        custom_keys={
            'positional_encoding': dict(lr_mult=0.1, decay_mult=0.0),
            'pos_embed': dict(lr_mult=0.1, decay_mult=0.0),
        }))

randomness = dict(seed=0)
