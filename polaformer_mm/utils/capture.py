"""The graph-capture switch: whether the model runs eagerly or is being recorded.

Several layers have two forms of the same maths: an eager one, fast on the CPU (the
blocked autograd Function of the attention op, the blocked MLP, cached window layouts,
interpolation by cached matrices, size checks in Python), and a plain one, out-of-place
tensor operations without Python decisions on sizes, which a graph records whole so that
one exported graph serves every input size. :func:`graph_capture` says which one runs.

Users who export or trace the model by hand need nothing: a jit trace or script, an ONNX
export (either exporter), ``torch.compile`` and ``torch.export`` are detected. Code that
records the model some other way (a FLOP counter hooking the operators, a custom tracer)
sets the switch for the duration::

    from polaformer_mm.utils.capture import exportable

    with exportable():
        graph = my_tracer(model, images)

The project's export tools (:mod:`polaformer_mm.deployment`) do so themselves. Under an
ONNX export (:func:`onnx_export`) the Pola attention modules take a third form, written for
graph runtimes (channels first, no head transposes). The
switch is global to the process, as timm's ``set_exportable``; :func:`exportable` puts
the previous value back on exit.
"""
import contextlib
from typing import Iterator

import torch

from .compat import is_compiling, is_exporting

__all__ = ['is_exportable', 'set_exportable', 'exportable', 'graph_capture', 'onnx_export']

_exportable = False


def is_exportable() -> bool:
    """Whether the model is set to take its plain (exportable) forms, by
    :func:`set_exportable` or :func:`exportable`."""
    return _exportable


def set_exportable(flag: bool = True) -> bool:
    """Set whether the model takes its plain (exportable) forms even when no capture is
    detected (see the module docstring).

    Args:
        flag (bool): True for the plain forms. Default: True.

    Returns:
        bool: the previous setting.
    """
    global _exportable
    previous, _exportable = _exportable, bool(flag)
    return previous


@contextlib.contextmanager
def exportable(flag: bool = True) -> Iterator[None]:
    """Within the ``with`` block the switch is ``flag`` (:func:`set_exportable`); the
    previous value is put back on exit.

    Args:
        flag (bool): True for the plain forms. Default: True.
    """
    previous = set_exportable(flag)
    try:
        yield
    finally:
        set_exportable(previous)


def graph_capture() -> bool:
    """Whether the running code is being recorded into a graph rather than run: the
    switch is set (:func:`is_exportable`), or a ``torch.jit`` trace or script, an ONNX
    export (either exporter), ``torch.compile`` or ``torch.export`` records it. Layers
    take their plain tensor formulations then: no Python caches keyed by sizes, no
    eager-only fast paths (autograd Functions, in-place blocks), no branches on sizes."""
    return bool(_exportable or torch.jit.is_tracing() or torch.jit.is_scripting()
                or torch.onnx.is_in_onnx_export() or is_compiling() or is_exporting())


def onnx_export() -> bool:
    """Whether an ONNX exporter (either one) records the running code: a case of
    :func:`graph_capture` in which layers take the form an exported graph runs fastest
    in, where it has one (the channels-first attention of
    :meth:`~polaformer_mm.models.PolaLinearAttention.forward_channels_first`). A graph
    runtime copies the whole tensor at every transpose, which a trace for ``torch.compile``
    would fuse away."""
    return bool(torch.onnx.is_in_onnx_export())
