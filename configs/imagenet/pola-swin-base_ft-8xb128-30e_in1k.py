# Fine-tuning Pola-Swin-B on ImageNet-1k from a converted official checkpoint, 224x224:
# the model, data and augmentation of pola-swin-base_8xb128_in1k.py,
# with the schedule of the Swin Transformer fine-tuning recipe (microsoft/Swin-Transformer
# configs/swin/swin_base_patch4_window7_224_22kto1k_finetune.yaml: 30 epochs, 5-epoch
# linear warm-up, cosine, AdamW base lr 2e-5 per 512 images, warm-up from 2e-8 and down to
# 2e-7 per 512, wd 1e-8), at 8 x 128 = 1024 images. The backbone's
# init_cfg loads the backbone.* keys of checkpoints/pola_swin_b_mm.pth (official2mm.py's
# conversion, or softmax2pola.py's warm start); the classifier head starts from its
# initialisation. To start from the official head too (official2mm.py files hold it):
#   --cfg-options load_from=checkpoints/pola_swin_b_mm.pth
_base_ = './pola-swin-base_8xb128_in1k.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        init_cfg=dict(
            type='Pretrained', checkpoint='checkpoints/pola_swin_b_mm.pth', prefix='backbone.')))

optim_wrapper = dict(optimizer=dict(lr=2e-5 * 1024 / 512, weight_decay=1e-8))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=5, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=2e-7 * 1024 / 512, by_epoch=True, begin=5)
]
train_cfg = dict(max_epochs=30)
