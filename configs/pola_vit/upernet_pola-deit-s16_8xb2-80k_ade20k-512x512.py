# Pola-DeiT-S/16 + UperNet, ADE20K, DeiT UperNet protocol: data, schedule and optimizer
# (512x512, 8x2, 80k, AdamW lr 6e-5 wd 0.01, 1500-iter warm-up + poly, custom_keys rules)
# come from the softmax baseline upernet_deit-s16_8xb2-80k_ade20k-512x512.py;
# only the backbone is swapped: PolaViT with Pola attention in every block, the same
# outputs as the baseline's ViT (blocks 2/5/8/11, no final norm, 384 channels), drop path
# 0.1. Its position embedding and positional encodings P lie on the 14x14 grid of
# pretrain_img_size=224 (that of the ImageNet weights) and are resized bicubically to the
# input's grid at run time (32x32 for a 512x512 crop).
#
# Weights: no official Pola-DeiT checkpoint exists. checkpoints/pola_deit_s_mm.pth is the
# softmax DeiT-S ImageNet file turned into Pola-DeiT by the warm-start converter
# (tools/model_converters/softmax2pola.py), or the checkpoint of an ImageNet run of
# configs/imagenet/pola-deit-small_*_in1k.py (see configs/pola_vit/README.md). To
# warm-start from the softmax release while the model is built, use the commented init_cfg.
_base_ = './upernet_deit-s16_8xb2-80k_ade20k-512x512.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='PolaViT',
        arch='deit-small',
        pretrain_img_size=224,
        attn_types='L',
        out_indices=(2, 5, 8, 11),
        final_norm=False,
        interpolate_mode='bicubic',
        drop_path_rate=0.1,
        # warm start from the softmax release instead (see the header):
        # init_cfg=dict(type='WarmStart', checkpoint='https://download.openmmlab.com/mmclassification/v0/deit/deit-small_pt-4xb256_in1k_20220218-9425b9bb.pth', prefix='backbone.'),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_deit_s_mm.pth')))
