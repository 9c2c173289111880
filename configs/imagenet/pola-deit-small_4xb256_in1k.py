# Pola-DeiT-S on ImageNet-1k, 224x224: mmpretrain's
# `deit/deit-small_4xb256_in1k.py` (the recipe of the softmax baseline, top-1 80.69 in
# mmpretrain's model zoo: 300 epochs, 4 GPUs x 256 images, AdamW lr 1e-3 for 1024
# images, wd 0.05, 20-epoch warm-up, cosine, clip 5.0, RandAugment, random erasing,
# Mixup 0.8 / CutMix 1.0, label smoothing 0.1; no decay for 1-D parameters, norms, cls_token
# and pos_embed; no drop path and no EMA, as mmpretrain sets tiny / small).
# Only the backbone is swapped: PolaViT with Pola attention in every block, giving its
# classification output (the class token after the final norm) to the head as mmpretrain's
# VisionTransformer does. Pola's power, scale and
# positional_encoding keep weight decay.
#
# No official Pola-DeiT weights exist: this config trains from scratch;
# pola-deit-small_ft-4xb256-30e_in1k.py fine-tunes a warm start from the softmax DeiT-S.
# Evaluate a checkpoint with
#   python tools/test.py configs/imagenet/pola-deit-small_4xb256_in1k.py CHECKPOINT
_base_ = 'mmpretrain::deit/deit-small_4xb256_in1k.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='PolaViT',
        arch='deit-small',
        img_size=224,
        attn_types='L',
        final_norm=True,
        output_cls_token=True,
        drop_path_rate=0.))
