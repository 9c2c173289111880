"""Pola-Swin's balanced linear windows (``linear_window_layout='balanced'``): the window
count and sides, the layout (a gather of the padded, rolled map and back, the same when a
trace computes the sizes), the padding mask, the block on each window equal to the
attention on its real tokens, and the backbone equal to the official layout wherever the
maps are multiples of the window (224 for Pola-Swin-T)."""
import pytest
import torch
import torch.nn.functional as F

from polaformer_mm import PolaSwin
from polaformer_mm.models.attention import PolaLinearAttention
from polaformer_mm.models.backbones.pola_swin import SwinBlock
from polaformer_mm.models.utils import resize_token_grid
from polaformer_mm.models.window_geometry import (balanced_window, captured_window_layout,
                                                  padded_size, window_gather, window_padding,
                                                  window_shift)

CPU = torch.device('cpu')


@pytest.mark.parametrize('size, count, side', [(128, 3, 43), (129, 3, 43), (200, 4, 50),
                                               (56, 1, 56), (224, 4, 56), (57, 2, 29), (20, 1, 20)])
def test_balanced_window_count_and_side(size, count, side):
    """As many windows as the official layout (ceil(size / 56)), each at most 56, fewer
    than ``count`` padded tokens; the same for a size given as a 0-dim tensor."""
    assert balanced_window(size, 56) == side
    assert int(balanced_window(torch.tensor(size), 56)) == side
    assert padded_size(size, side) // side == -(-size // 56) == count
    assert 0 <= padded_size(size, side) - size < count
    assert side <= 56


def test_a_128_map_pads_one_row_and_column_not_40():
    """The first stage of Pola-Swin-T at 512x512: 3x3 windows of 43x43 (129x129 tokens,
    1.016x the map) where the official layout takes 3x3 windows of 56x56 (168x168,
    1.72x)."""
    side = balanced_window(128, 56)
    padding = window_padding(128, 128, (side, side), 0, CPU)
    assert padding.shape == (9, 43 * 43)
    assert int(padding.sum()) == 129 * 129 - 128 * 128
    official = window_padding(128, 128, 56, 0, CPU)
    assert official.shape == (9, 56 * 56)
    assert int(official.sum()) == 168 * 168 - 128 * 128


MAPS = [(10, 13, 8, False), (10, 13, 8, True), (128, 129, 56, True), (5, 30, 8, True),
        (17, 17, 4, True)]


@pytest.mark.parametrize('H, W, ws, shifted', MAPS)
def test_balanced_gather_is_pad_roll_partition_and_back(H, W, ws, shifted):
    wh, ww = balanced_window(H, ws), balanced_window(W, ws)
    shift = window_shift((H, W), (wh, ww), shifted)
    # the official shift rule: both sides larger than the configured window
    assert shift == ((wh // 2, ww // 2) if shifted and min(H, W) > ws else (0, 0))
    Hp, Wp = padded_size(H, wh), padded_size(W, ww)
    x = torch.randn(2, H, W, 3)
    to_windows, from_windows = window_gather(H, W, (wh, ww), shift, CPU)
    padded = F.pad(x, (0, 0, 0, Wp - W, 0, Hp - H))
    windows = padded.reshape(2, Hp * Wp, 3).index_select(1, to_windows).view(-1, wh * ww, 3)
    rolled = torch.roll(padded, (-shift[0], -shift[1]), dims=(1, 2))
    step = rolled.view(2, Hp // wh, wh, Wp // ww, ww, 3).transpose(2, 3).reshape(-1, wh * ww, 3)
    torch.testing.assert_close(windows, step, rtol=0, atol=0)
    back = windows.view(2, -1, 3).index_select(1, from_windows)
    torch.testing.assert_close(back, x.reshape(2, H * W, 3), rtol=0, atol=0)
    # padding: the tokens of the padded rows and columns, wherever the roll put them
    marker = F.pad(torch.zeros(1, H, W, 1), (0, 0, 0, Wp - W, 0, Hp - H), value=1.)
    marker = marker.reshape(1, Hp * Wp, 1).index_select(1, to_windows).view(-1, wh * ww) > 0
    padding = window_padding(H, W, (wh, ww), shift, CPU)
    if (Hp, Wp) == (H, W):
        assert padding is None and not marker.any()
    else:
        assert torch.equal(padding, marker)
    # a trace computes the sizes and the shift from 0-dim tensors: the same layout
    tH, tW = torch.tensor(H), torch.tensor(W)
    traced = captured_window_layout(tH, tW, (balanced_window(tH, ws), balanced_window(tW, ws)),
                                    shifted, CPU)
    assert torch.equal(traced[0], to_windows) and torch.equal(traced[1], from_windows)
    assert torch.equal(traced[2] < 0, marker)


def _block(shifted):
    block = SwinBlock(
        16,
        2,
        attn_type='L',
        shifted=shifted,
        linear_window_size=8,
        pos_grid=(8, 8),
        linear_window_layout='balanced',
        mlp_ratio=2.)
    for p in block.parameters():  # the Pola parameters start at zero: randomise all
        torch.nn.init.normal_(p, std=0.3)
    return block.double().eval()


def test_each_balanced_window_is_the_attention_on_its_real_tokens():
    """A 10x13 map in windows of 8: 2x2 windows of 5x7 (one padded column). Every window
    gives on its real tokens what the attention gives on them alone, with ``P`` resized
    to the window (5x7) and cropped to the tokens: padded keys take no part."""
    torch.manual_seed(0)
    H, W = 10, 13
    block = _block(False)
    x = torch.randn(2, H * W, 16, dtype=torch.float64)
    with torch.no_grad():
        out = block._window_attention(x, (H, W)).view(2, H, W, 16)
        P = resize_token_grid(block.attn.positional_encoding, (8, 8), (5, 7), 'bicubic')
        grid = x.view(2, H, W, 16)
        for r in range(2):
            for c in range(2):
                rows, cols = slice(5 * r, 5 * r + 5), slice(7 * c, min(7 * c + 7, W))
                h, w = 5, cols.stop - cols.start
                exact = PolaLinearAttention(16, 2, pos_grid=(h, w), family='swin').double()
                state = dict(block.attn.state_dict())
                state['positional_encoding'] = P.view(1, 5, 7, 16)[:, :, :w].reshape(1, -1, 16)
                exact.load_state_dict(state)
                ref = exact(grid[:, rows, cols].reshape(2, h * w, 16), (h, w))
                torch.testing.assert_close(
                    out[:, rows, cols].reshape(2, h * w, 16), ref, rtol=0, atol=1e-12)


def _small(layout):
    torch.manual_seed(0)
    model = PolaSwin(
        arch=dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 2, 4]),
        window_size=3,
        pretrain_img_size=64,
        linear_window_size=8,
        linear_window_layout=layout,
        drop_path_rate=0.)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return model.eval()


def test_balanced_equals_official_where_the_maps_are_multiples_of_the_window():
    official, balanced = _small('official'), _small('balanced')
    balanced.load_state_dict(official.state_dict())
    for hw, same in [((64, 64), True), ((128, 128), True), ((64, 192), True), ((72, 88), False)]:
        x = torch.randn(1, 3, *hw)
        with torch.no_grad():
            pairs = list(zip(official(x), balanced(x)))
        for a, b in pairs:
            assert a.shape == b.shape
        assert all(torch.equal(a, b) for a, b in pairs) == same, hw


def test_pola_swin_t_balanced_is_the_official_model_at_224():
    torch.manual_seed(0)
    official = PolaSwin(arch='tiny', drop_path_rate=0.).eval()
    balanced = PolaSwin(arch='tiny', drop_path_rate=0., linear_window_layout='balanced').eval()
    balanced.load_state_dict(official.state_dict())
    for p in balanced.parameters():
        assert p.requires_grad
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        for a, b in zip(official(x), balanced(x)):
            assert torch.equal(a, b)


def test_unknown_layout_is_refused():
    with pytest.raises(ValueError, match="linear_window_layout must be one of"):
        PolaSwin(arch='tiny', linear_window_layout='even')
