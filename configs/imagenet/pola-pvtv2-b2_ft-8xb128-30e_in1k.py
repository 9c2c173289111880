# Warm-start fine-tuning of Pola-PVTv2-B2 on ImageNet-1k, 224x224: the model, data and
# augmentation of pola-pvtv2-b2_8xb128_in1k.py, with the schedule of the Swin
# Transformer fine-tuning recipe (microsoft/Swin-Transformer configs/swin/
# swin_base_patch4_window7_224_22kto1k_finetune.yaml: 30 epochs, 5-epoch linear warm-up,
# cosine, AdamW base lr 2e-5 per 512 images, warm-up from 2e-8 and down to 2e-7 per 512,
# wd 1e-8), at 8 x 128 = 1024 images, as the Pola-PVT / Pola-Swin fine-tuning configs.
#
# The backbone's init_cfg reads checkpoints/pola_pvtv2_b2_mm.pth (prefix 'backbone.').
# No official Pola-PVTv2 checkpoint
# exists: this file is the backbone of the softmax PVTv2-B2 classifier
#   https://github.com/whai362/PVT/releases/download/v2/pvt_v2_b2.pth
# warm-started by tools/model_converters/softmax2pola.py (every tensor of the same meaning
# copied, the Pola-only parameters freshly initialised; it holds backbone.* only, so the
# classifier head starts from its initialisation):
#   python tools/model_converters/softmax2pola.py SOFTMAX.pth checkpoints/pola_pvtv2_b2_mm.pth \
#       --config configs/imagenet/pola-pvtv2-b2_8xb128_in1k.py
# or the checkpoint of a run of pola-pvtv2-b2_8xb128_in1k.py (its backbone; add
# --cfg-options load_from=CHECKPOINT for its head too).
_base_ = './pola-pvtv2-b2_8xb128_in1k.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        init_cfg=dict(
            type='Pretrained', checkpoint='checkpoints/pola_pvtv2_b2_mm.pth', prefix='backbone.')))

optim_wrapper = dict(optimizer=dict(lr=2e-5 * 1024 / 512, weight_decay=1e-8))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=5, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=2e-7 * 1024 / 512, by_epoch=True, begin=5)
]
train_cfg = dict(max_epochs=30)
