"""Helpers shared by the ONNX export tests."""
import torch


def randomised(build, seed=0):
    """A backbone whose parameters are all random (the Pola exponents, scales and
    positional encodings too, which start at zero), in eval mode."""
    torch.manual_seed(seed)
    model = build().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model
