# Pola-PVTv2-B0 on ImageNet-1k, 224x224, with the PolaFormer recipe of the Pola-PVT
# configs (pola-pvt-tiny_8xb128_in1k.py): ZacharyMeng/PolaFormer Polaformer/config.py =
# mmpretrain's `swin_transformer/swin-tiny_16xb64_in1k.py` recipe (300 epochs, AdamW lr 1e-3
# for 1024 images, wd 0.05, 20-epoch warm-up, cosine, clip 5.0, RandAugment, random erasing,
# Mixup/CutMix, label smoothing 0.1), as 8 GPUs x 128 images; no decay for 1-D parameters
# (norms, biases, the stage norms layers.i.2), decay on Pola's power, scale and
# positional_encoding. Drop path 0.1 (PVTv2's, whai362/PVT classification/configs/pvt_v2/).
# NOTE: PVTv2's own ImageNet training (whai362/PVT classification/, the DeiT code base:
# base lr 5e-4 per 512 images, 5-epoch warm-up, min lr 1e-5, no gradient clip) differs in
# the warm-up and the clipping; these configs keep the recipe of the other Pola configs.
#
# No official Pola-PVTv2 weights exist: this config trains from scratch;
# pola-pvtv2-b0_ft-8xb128-30e_in1k.py fine-tunes a warm start from the softmax PVTv2-B0.
# Evaluate a checkpoint with
#   python tools/test.py configs/imagenet/pola-pvtv2-b0_8xb128_in1k.py CHECKPOINT
# Test pipeline: short side 256 (bicubic), centre crop 224.
_base_ = 'mmpretrain::swin_transformer/swin-tiny_16xb64_in1k.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='PolaPVTv2',
        arch='b0',
        attn_types='LLLL',
        drop_path_rate=0.1,
        out_indices=(3, )),
    head=dict(in_channels=256))

# 8 GPUs x 128 images = 1024, the batch the recipe's lr is set for
train_dataloader = dict(batch_size=128)
