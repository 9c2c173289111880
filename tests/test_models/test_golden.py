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
        stages = [nlc_to_nchw(x, hw) for x, hw in model.backbone.forward_stages(data['input'])]
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
    from polaformer_mm.models.window_geometry import window_mask
    data = load_golden(golden_dir, 'pola_swin_micro_LLSS.pt')
    official = data['state_dict']['layers.2.blocks.1.attn_mask']  # 14x14, window 7
    ours = window_mask(14, 14, 7, 3, torch.device('cpu'))
    # the same pairs masked; -inf where the official buffer holds -100 (the same
    # softmax to float precision, without subnormal weights)
    assert set(official.unique().tolist()) == {0., -100.}
    assert torch.equal(ours == float('-inf'), official == -100)
    assert torch.equal(ours == 0, official == 0)


def test_swin_224_golden_in_both_window_forms(golden_dir):
    """At 224 every 'L' stage is one window: the windowed (official) and the
    global form are the same computation."""
    data = load_golden(golden_dir, 'pola_swin_micro_LLSS.pt')
    for form in (56, None):
        model = build_golden_classifier(data, linear_window_size=form)
        with torch.no_grad():
            logits = model(data['input'], mode='tensor')
        torch.testing.assert_close(
            logits, data['logits'], rtol=0, atol=1e-4, msg=f'linear_window_size={form}')


def test_swin_448_golden_uses_windows(golden_dir):
    """At 448 the official stage-1 map (112x112) is split into four 56x56 windows,
    shifted by 28 in the second block, each with the 56x56 P as learned; stage 2
    (56x56) is one window. The logits are checked by the tests above."""
    data = load_golden(golden_dir, 'pola_swin_micro_LLSS_448.pt')
    assert data['arch']['img_size'] == 448 and data['arch']['window_size'] == 56
    model = build_golden_classifier(data)
    stages = model.backbone.stages
    assert [b.window_size for b in stages[0].blocks] == [56, 56]
    assert [b.shifted for b in stages[0].blocks] == [False, True]
    for stage in stages[:2]:
        assert all(tuple(b.attn.pos_grid) == (56, 56) for b in stage.blocks)
    # without the shift of the second block the result is another one
    stages[0].blocks[1].shifted = False
    with torch.no_grad():
        unshifted = model(data['input'], mode='tensor')
    assert (unshifted - data['logits']).abs().max() > 1e-3
