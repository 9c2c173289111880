# Softmax baseline, DeiT UperNet protocol: mmseg's
# `vit/vit_deit-b16_mln_upernet_8xb2-160k_ade20k-512x512.py`
# (DeiT-B/16 as mmseg's `VisionTransformer`, blocks 2/5/8/11 out without a final norm,
# MultiLevelNeck (x4, x2, x1, x0.5) + UperNet, ADE20K, 512x512 crops, 8 GPUs x 2 images,
# 160k iterations, AdamW lr 6e-5 wd 0.01, 1500-iter linear warm-up then poly (power 1.0),
# drop path 0.1, SyncBN in the heads), unchanged but for the extra inert custom key below.
# Its weights: mmseg's `pretrain/deit_base_patch16_224-b5f2ef4d.pth`, the official DeiT
# file https://dl.fbaipublicfiles.com/deit/deit_base_patch16_224-b5f2ef4d.pth converted with
# mmseg's tools/model_converters/vit2mmseg.py.
#
# `upernet_pola-deit-b16_mln_8xb2-160k_ade20k-512x512.py` inherits this file and swaps the backbone.
_base_ = 'mmseg::vit/vit_deit-b16_mln_upernet_8xb2-160k_ade20k-512x512.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

# The optimizer rules of mmseg's ViT UperNet (no decay for keys holding 'pos_embed',
# 'cls_token' or 'norm'; the LayerNorms of both backbones are named ln1 / ln2 and keep
# their decay, as upstream), extended by Pola's positional encoding P
# ('positional_encoding', inert for the softmax ViT), as the Swin-protocol configs of
# configs/pola_swin/ do. Pola's learnable 'power' and 'scale' keep weight decay.
optim_wrapper = dict(
    paramwise_cfg=dict(
        custom_keys={
            'pos_embed': dict(decay_mult=0.),
            'cls_token': dict(decay_mult=0.),
            'norm': dict(decay_mult=0.),
            'positional_encoding': dict(decay_mult=0.),
        }))

randomness = dict(seed=0)
