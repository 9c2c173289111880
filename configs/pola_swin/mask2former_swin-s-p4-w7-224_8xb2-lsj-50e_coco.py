# Softmax baseline, Mask2Former Swin protocol: mmdet's
# `mask2former/mask2former_swin-s-p4-w7-224_8xb2-lsj-50e_coco.py` (Swin-S + Mask2Former, COCO
# instance segmentation, large-scale jitter 1024x1024, 8x2 images, 368750 iterations (~50
# epochs), AdamW lr 1e-4 wd 0.05 with backbone lr x0.1, gradient clip 0.01, drop path 0.3),
# unchanged but for the extra inert custom_keys below.
# `mask2former_pola-swin-s-p4-w7-224_8xb2-lsj-50e_coco.py` inherits this file and swaps the
# backbone.
_base_ = 'mmdet::mask2former/mask2former_swin-s-p4-w7-224_8xb2-lsj-50e_coco.py'  # noqa

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

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
