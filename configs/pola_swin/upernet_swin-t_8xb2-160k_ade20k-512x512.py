# Softmax baseline, Swin UperNet protocol: mmseg's
# `swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py` (Swin-T +
# UperNet, ADE20K, 512x512 crops, 8 GPUs x 2 images, 160k iterations, AdamW lr 6e-5 wd 0.01,
# 1500-iter linear warm-up from 1e-6 then poly (power 1.0) to 0, drop path 0.3, SyncBN in the
# heads, whole-image test), which is the recipe of Agent-Attention's
# downstream/segmentation/configs/agent_swin/upernet_agent_swin_t_9-12-14-7.py (LeapLabTHU, the
# dense code of PolaFormer's lineage) in mmseg 1 form; unchanged but for the extra inert
# no-decay keys below and seed 0. Sources per setting: docs/user_guides/protocol.md.
#
# `upernet_pola-swin-t_8xb2-160k_ade20k-512x512.py` inherits this file and swaps the backbone;
# the -s and -b baselines change the Swin size as mmseg's configs do.
_base_ = 'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py'

custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)

model = dict(pretrained=None)

# The Swin no-decay rules, shared by the baseline and the Pola config: the lineage's
# custom_keys (absolute_pos_embed, relative_position_bias_table and every 'norm' parameter;
# Agent-Attention adds its own position terms, an_bias ... wa_bias), with Pola's positional
# encoding P ('positional_encoding') in the place of those terms and PVT's 'pos_embed' (both
# inert for a softmax Swin). Pola's learnable 'power' and 'scale' keep weight decay, as in the
# official classification training (its optimizer exempts only 1-D parameters, biases and the
# relative position tables).
optim_wrapper = dict(
    paramwise_cfg=dict(
        custom_keys={
            'absolute_pos_embed': dict(decay_mult=0.),
            'relative_position_bias_table': dict(decay_mult=0.),
            'norm': dict(decay_mult=0.),
            'positional_encoding': dict(decay_mult=0.),
            'pos_embed': dict(decay_mult=0.),
        }))

randomness = dict(seed=0)
