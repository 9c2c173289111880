"""The window geometry the Swin stages, the tools and the tests share: the gather layout
against padding, rolling and partitioning done step by step, the captured (traceable)
layout against the cached one, and the masks against the shift regions."""
import pytest
import torch
import torch.nn.functional as F

from polaformer_mm.models.window_geometry import (captured_window_layout, padded_size,
                                                  window_gather, window_mask, window_padding,
                                                  window_partition, window_regions, window_reverse,
                                                  window_shift)

CPU = torch.device('cpu')

# (H, W, window, shifted): padded and shifted, exact multiples, one window row
MAPS = [(10, 11, 4, True), (8, 12, 4, True), (9, 7, 3, False), (3, 20, 4, True), (4, 4, 4, True)]


def _step_by_step(x, H, W, ws, shift):
    """(B, H, W, C) -> windows (B * nW, T, C): pad, roll by -shift, partition."""
    Hp, Wp = padded_size(H, ws), padded_size(W, ws)
    x = F.pad(x, (0, 0, 0, Wp - W, 0, Hp - H))
    if shift:
        x = torch.roll(x, (-shift, -shift), dims=(1, 2))
    return window_partition(x, ws)


@pytest.mark.parametrize('H, W, ws, shifted', MAPS)
def test_gather_is_pad_roll_partition_and_back(H, W, ws, shifted):
    shift = window_shift((H, W), ws, shifted)
    x = torch.randn(2, H, W, 5)
    Hp, Wp = padded_size(H, ws), padded_size(W, ws)
    to_windows, from_windows = window_gather(H, W, ws, shift, CPU)
    padded = F.pad(x, (0, 0, 0, Wp - W, 0, Hp - H)).reshape(2, Hp * Wp, 5)
    windows = padded.index_select(1, to_windows).view(-1, ws * ws, 5)
    torch.testing.assert_close(windows, _step_by_step(x, H, W, ws, shift), rtol=0, atol=0)
    back = windows.view(2, -1, 5).index_select(1, from_windows)
    torch.testing.assert_close(back, x.reshape(2, H * W, 5), rtol=0, atol=0)
    # window_reverse undoes window_partition; rolling back and cropping gives the map
    rolled = window_reverse(windows, ws, Hp, Wp)
    if shift:
        rolled = torch.roll(rolled, (shift, shift), dims=(1, 2))
    torch.testing.assert_close(rolled[:, :H, :W], x, rtol=0, atol=0)


@pytest.mark.parametrize('H, W, ws, shifted', MAPS)
def test_captured_layout_equals_the_cached_one(H, W, ws, shifted):
    shift = window_shift((H, W), ws, shifted)
    to_windows, from_windows, regions = captured_window_layout(H, W, ws, shifted, CPU)
    expected_to, expected_from = window_gather(H, W, ws, shift, CPU)
    assert torch.equal(to_windows, expected_to) and torch.equal(from_windows, expected_from)
    expected = window_regions(H, W, ws, shift)
    if expected is None:  # neither shift nor padding: one region, nothing padded
        assert (regions == 0).all()
    else:
        assert torch.equal(regions, expected)
    # a trace passes the sizes as 0-dim tensors: the same layout
    traced = captured_window_layout(torch.tensor(H), torch.tensor(W), ws, shifted, CPU)
    for a, b in zip(traced, (to_windows, from_windows, regions)):
        assert torch.equal(a, b)


@pytest.mark.parametrize('H, W, ws, shifted', MAPS)
def test_masks_follow_the_regions(H, W, ws, shifted):
    shift = window_shift((H, W), ws, shifted)
    regions = window_regions(H, W, ws, shift)
    mask, padding = window_mask(H, W, ws, shift, CPU), window_padding(H, W, ws, shift, CPU)
    if regions is None:
        assert mask is None and padding is None
        return
    differ = regions[:, :, None] != regions[:, None, :]
    assert torch.equal(mask == float('-inf'), differ) and (mask[~differ] == 0).all()
    if (padded_size(H, ws), padded_size(W, ws)) == (H, W):
        assert padding is None
    else:
        assert torch.equal(padding, regions < 0)
        assert int(padding.sum()) == padded_size(H, ws) * padded_size(W, ws) - H * W


def test_shift_follows_the_official_rule():
    """Half a window on shifted blocks of maps larger than the window on both sides."""
    assert window_shift((9, 9), 4, True) == 2
    assert window_shift((4, 9), 4, True) == 0
    assert window_shift((9, 9), 4, False) == 0
    assert padded_size(9, 4) == 12 and padded_size(8, 4) == 8


@pytest.mark.parametrize('capture', [False, True])
def test_linear_windows_never_build_the_softmax_mask(capture):
    """The linear ('L') windows take the padding only: their layout has no (nW, T, T)
    softmax mask (T = 3136 for 56 x 56 windows: 39 MB per window), neither cached nor
    recorded, while the softmax windows of the same map get theirs."""
    from polaformer_mm.models import PolaSwin
    from polaformer_mm.models.utils import window_layout
    from polaformer_mm.utils.capture import exportable

    window_mask.cache_clear()
    H, W, ws = 10, 11, 4  # padded and shifted
    with exportable(capture):
        linear = window_layout((H, W), ws, True, CPU, torch.float32, softmax_mask=False)
        softmax = window_layout((H, W), ws, True, CPU, torch.float32)
    assert linear.mask is None and linear.padding is not None
    assert softmax.mask is not None and softmax.mask.shape == (9, 16, 16)
    torch.testing.assert_close(linear.padding, softmax.padding)
    assert window_mask.cache_info().currsize == (0 if capture else 1)

    window_mask.cache_clear()
    model = PolaSwin(
        arch=dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 2, 4]),
        attn_types='LLLL',
        window_size=3,
        linear_window_size=5,
        pretrain_img_size=64).eval()
    with torch.no_grad():
        model(torch.randn(1, 3, 52, 76))  # 13x19 first map: padded, shifted windows
    assert window_mask.cache_info().currsize == 0
