"""depthwise_conv2d: the result and the gradients of F.conv2d, with a faster CPU backward."""
import pytest
import torch
import torch.nn.functional as F

from polaformer_mm.ops import depthwise_conv2d


@pytest.mark.parametrize('shape,k', [((2, 3, 7, 9), 5), ((1, 4, 5, 5), 3), ((3, 2, 1, 6), 7),
                                     ((1, 1, 11, 4), 1)])
@pytest.mark.parametrize('channels_last', [False, True, 'tokens'])
@pytest.mark.parametrize('with_bias', [True, False])
def test_same_result_and_gradients_as_conv2d(shape, k, channels_last, with_bias):
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=torch.float64)
    if channels_last == 'tokens':  # channels innermost, a view of wider tokens
        x = torch.randn(shape[0], shape[2], shape[3], 2 * shape[1], dtype=torch.float64)
        x = x[..., :shape[1]].permute(0, 3, 1, 2)
    elif channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    weight = torch.randn(shape[1], 1, k, k, dtype=torch.float64)
    bias = torch.randn(shape[1], dtype=torch.float64) if with_bias else None
    inputs = [t.requires_grad_() for t in (x, weight, bias) if t is not None]
    grad = torch.randn(shape, dtype=torch.float64)

    ours = depthwise_conv2d(x, weight, bias)
    ref = F.conv2d(x, weight, bias, padding=k // 2, groups=shape[1])
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
    ours_grads = torch.autograd.grad(ours, inputs, grad)
    ref_grads = torch.autograd.grad(ref, inputs, grad)
    for a, b in zip(ours_grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_gradcheck_and_partial_gradients():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 1, 3, 3, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(depthwise_conv2d, (x, weight, bias))
    # only the weight needs a gradient (a frozen input), and only the input
    (gw, ) = torch.autograd.grad(depthwise_conv2d(x.detach(), weight).sum(), weight)
    (gx, ) = torch.autograd.grad(depthwise_conv2d(x, weight.detach()).sum(), x)
    ref = F.conv2d(x, weight, padding=1, groups=3).sum()
    rgx, rgw = torch.autograd.grad(ref, (x, weight))
    torch.testing.assert_close(gw, rgw)
    torch.testing.assert_close(gx, rgx)


def test_bad_weight_is_named():
    with pytest.raises(ValueError, match=r'expects a \(4, 1, k, k\) weight with odd k'):
        depthwise_conv2d(torch.randn(1, 4, 5, 5), torch.randn(4, 1, 4, 4))
    with pytest.raises(ValueError, match=r'\(4, 1, k, k\)'):
        depthwise_conv2d(torch.randn(1, 4, 5, 5), torch.randn(2, 1, 3, 3))
