# Fine-tuning Pola-PVT-M on ImageNet-1k from a warm-started checkpoint, 224x224:
# the model, data and augmentation of pola-pvt-medium_8xb128_in1k.py,
# with the schedule of the Swin Transformer fine-tuning recipe (microsoft/Swin-Transformer
# configs/swin/swin_base_patch4_window7_224_22kto1k_finetune.yaml: 30 epochs, 5-epoch
# linear warm-up, cosine, AdamW base lr 2e-5 per 512 images, warm-up from 2e-8 and down to
# 2e-7 per 512, wd 1e-8), at 8 x 128 = 1024 images. The backbone's
# init_cfg loads the backbone.* keys of checkpoints/pola_pvt_m_mm.pth. The official
# PolaFormer release has no Pola-PVT-M weights (its table: Pola-PVT-T/S, Pola-Swin-T/S/B):
# write the file with softmax2pola.py's warm start from the official PVT v1 M weights
#   python tools/model_converters/softmax2pola.py pvt_medium.pth \
#       checkpoints/pola_pvt_m_mm.pth \
#       --config configs/imagenet/pola-pvt-medium_ft-8xb128-30e_in1k.py
# (docs/user_guides/warm_start.md), or from a Pola-PVT-M you trained with
# pola-pvt-medium_8xb128_in1k.py. The classifier head starts from its initialisation.
_base_ = './pola-pvt-medium_8xb128_in1k.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        init_cfg=dict(
            type='Pretrained', checkpoint='checkpoints/pola_pvt_m_mm.pth', prefix='backbone.')))

optim_wrapper = dict(optimizer=dict(lr=2e-5 * 1024 / 512, weight_decay=1e-8))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=5, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=2e-7 * 1024 / 512, by_epoch=True, begin=5)
]
train_cfg = dict(max_epochs=30)
