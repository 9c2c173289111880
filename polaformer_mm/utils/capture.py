"""The graph-capture switch: whether the model runs eagerly or is being recorded.

Several layers have two forms of the same maths: an eager one, fast on the CPU (the
blocked autograd Function of the attention op, the blocked MLP, cached window layouts,
interpolation by cached matrices, size checks in Python), and a plain one, out-of-place
tensor operations without Python decisions on sizes, which a graph records whole so that
one exported graph serves every input size. :func:`graph_capture` says which one runs.

Users who export or trace the model by hand need nothing for the plain forms: a jit trace
or script, an ONNX export (either exporter), ``torch.compile`` and ``torch.export`` are
detected. Code that records the model some other way (a FLOP counter hooking the
operators, a custom tracer) sets the switch for the duration::

    from polaformer_mm.utils.capture import exportable

    with exportable():
        graph = my_tracer(model, images)

The project's export tools (:mod:`polaformer_mm.deployment`) do so themselves. The switch
is global to the process, as timm's ``set_exportable``; :func:`exportable` puts the
previous value back on exit.

The switch chooses between the eager and the plain form only; no model asks it for a
third. The forms written for graph runtimes (the Pola attention channels first, without
head transposes) or for the operators of older ONNX opsets are chosen by the exporter:
declared beside their modules with
:func:`~polaformer_mm.utils.graph_forms.register_graph_form` and swapped in for the export
by :func:`~polaformer_mm.utils.graph_forms.graph_forms`, which the project's exporters
enter (a hand-written ``torch.onnx.export`` inside ``with graph_forms(model):`` records the
same graph as the tools).
"""
import contextlib
from typing import Iterator

import torch

from .compat import is_compiling, is_exporting

__all__ = ['is_exportable', 'set_exportable', 'exportable', 'graph_capture']

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
