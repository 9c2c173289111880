# Pola-PVTv2-B1 on ImageNet-1k, 224x224, with the recipe of pola-pvtv2-b0_8xb128_in1k.py
# (the PolaFormer recipe = mmpretrain's `swin_transformer/swin-tiny_16xb64_in1k.py`, 8 GPUs x
# 128 images; drop path 0.1, PVTv2's). Only the backbone and the head width differ from -b0.
# No official Pola-PVTv2 weights exist: this config trains from scratch;
# pola-pvtv2-b1_ft-8xb128-30e_in1k.py fine-tunes a warm start from the softmax PVTv2-B1.
_base_ = './pola-pvtv2-b0_8xb128_in1k.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(backbone=dict(arch='b1', drop_path_rate=0.1), head=dict(in_channels=512))
