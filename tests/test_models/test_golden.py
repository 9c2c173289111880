"""Our backbones reproduce the official PolaFormer code (tensors it produced)."""
import pytest
import torch

from polaformer_mm.models.attention import relative_position_index
from polaformer_mm.models.utils import nlc_to_nchw

from ._golden import GOLDEN_FILES, build_golden_classifier, load_golden


@pytest.mark.parametrize('name', GOLDEN_FILES)
def test_stage_outputs_and_logits_match_official(golden_dir, name):
    data = load_golden(golden_dir, name)
    model = build_golden_classifier(data)
    with torch.no_grad():
        stages = [
            nlc_to_nchw(x, hw)
            for x, hw in model.backbone.forward_stages(data['input'])
        ]
        logits = model(data['input'], mode='tensor')
    assert len(stages) == len(data['stage_outputs'])
    for i, (ours, ref) in enumerate(zip(stages, data['stage_outputs'])):
        assert ours.shape == ref.shape, f'stage {i}'
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-4, msg=f'stage {i}')
    torch.testing.assert_close(logits, data['logits'], rtol=0, atol=1e-4)


@pytest.mark.parametrize('name', GOLDEN_FILES)
def test_golden_in_float64(golden_dir, name):
    """Same weights in float64: still within tolerance (no float32-only luck)."""
    data = load_golden(golden_dir, name)
    model = build_golden_classifier(data).double()
    with torch.no_grad():
        logits = model(data['input'].double(), mode='tensor')
    torch.testing.assert_close(logits.float(), data['logits'], rtol=0, atol=1e-4)


def test_relative_position_index_matches_official_buffer(golden_dir):
    data = load_golden(golden_dir, 'pola_swin_micro_LLSS.pt')
    official = data['state_dict']['layers.2.blocks.0.attn.relative_position_index']
    assert torch.equal(relative_position_index(7), official)


def test_shift_mask_matches_official_buffer(golden_dir):
    from polaformer_mm.models.backbones.pola_swin import _window_mask
    data = load_golden(golden_dir, 'pola_swin_micro_LLSS.pt')
    official = data['state_dict']['layers.2.blocks.1.attn_mask']  # 14x14, window 7
    ours = _window_mask(14, 14, 7, 3, torch.device('cpu'))
    assert torch.equal(ours, official)
