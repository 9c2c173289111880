# Pola-PVT-L on ImageNet-1k, 224x224, with the official PolaFormer recipe of
# ZacharyMeng/PolaFormer Polaformer/config.py (= mmpretrain's
# `swin_transformer/swin-tiny_16xb64_in1k.py` recipe: 300 epochs, AdamW lr 1e-3 for 1024
# images, wd 0.05, 20-epoch warm-up, cosine, clip 5.0, RandAugment, random erasing,
# Mixup/CutMix, label smoothing 0.1), as 8 GPUs x 128 images. See
# pola-swin-tiny_8xb128_in1k.py for the weight decay rules (PVT's 'pos_embed' keeps decay,
# as in FLatten-PVT, whose no_weight_decay holds only 'cls_token').
# NOTE: PolaFormer's per-model cfgs/pola_pvt_{t,s,m,b}.yaml override the defaults for
# PVT: base lr 5e-4, 5-epoch warm-up from 1e-6, min lr 1e-5, no gradient clip for T/S
# and clip 1.0 for M/L, 128/64/64/32 images per GPU, drop path 0.1/0.1/0.3/0.3. These
# overrides are not applied here: these configs keep the common recipe above.
# Drop path 0.3 (official PVT / FLatten-PVT).
#
# Evaluate a checkpoint of this model (the official PolaFormer release has no Pola-PVT-L
# weights, only Pola-PVT-T/S and Pola-Swin-T/S/B):
#   python tools/test.py configs/imagenet/pola-pvt-large_8xb128_in1k.py \
#       work_dirs/pola-pvt-large_8xb128_in1k/epoch_300.pth
# Test pipeline: short side 256 (bicubic), centre crop 224, as the official TEST.CROP.
# Only the backbone differs from pola-pvt-tiny_8xb128_in1k.py.
_base_ = './pola-pvt-tiny_8xb128_in1k.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(backbone=dict(arch='large', drop_path_rate=0.3))
