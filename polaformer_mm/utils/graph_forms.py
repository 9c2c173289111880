"""Graph forms: the form of a module that an exported graph records, declared beside the
module and chosen by the exporter.

A model has one forward: the one training, testing and ``torch.compile`` run. Some modules
also have a form that a graph runtime runs faster (the Pola attention laid out channels
first, without the head transposes that a runtime copies whole) or that older ONNX opsets
can express (a softmax block without operators opset 11 lacks). Such a form is declared
with :func:`register_graph_form` next to the module's class, and nothing in the module's
``forward`` looks for it. The exporter enters :func:`graph_forms` around the export (the
project's export tools in :mod:`polaformer_mm.deployment` do); inside it every module of
the model whose class (or a base class) has a registered form runs that form instead of
its ``forward``::

    from polaformer_mm.utils.graph_forms import graph_forms

    with graph_forms(model):
        torch.onnx.export(model, images, 'model.onnx', opset_version=11)

A graph form computes what ``forward`` computes (up to rounding) with the same arguments;
the deployment tests compare the two. This module imports nothing of the package, so
that the models can declare their forms without importing the exporters.
"""
import contextlib
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch.nn as nn

__all__ = ['register_graph_form', 'graph_form_of', 'graph_forms', 'registered_graph_forms']

#: class -> form(module, *args, **kwargs)
_FORMS: Dict[type, Callable] = {}


def register_graph_form(cls: type, form: Optional[Callable] = None):
    """Declare ``form`` as what an exported graph records for every module of ``cls`` (and of
    its subclasses without a form of their own). ``form(module, *args, **kwargs)`` takes
    the arguments of the module's ``forward``. Usable as a decorator::

        @register_graph_form(MyAttention)
        def my_attention_graph_form(module, x, hw_shape):
            ...

    Args:
        cls (type): An ``nn.Module`` subclass.
        form (callable, optional): The form; omitted when used as a decorator.

    Returns:
        The form (so that the decorator leaves the function as it is).
    """
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise TypeError(f'register_graph_form takes an nn.Module class, got {cls!r}')

    def register(fn: Callable) -> Callable:
        if not callable(fn):
            raise TypeError(f'the graph form of {cls.__name__} must be callable, got {fn!r}')
        _FORMS[cls] = fn
        return fn

    return register if form is None else register(form)


def graph_form_of(module: nn.Module) -> Optional[Callable]:
    """The registered form of ``module``'s class or of its nearest base class that has
    one; None if none has."""
    for cls in type(module).__mro__:
        if cls in _FORMS:
            return _FORMS[cls]
    return None


def registered_graph_forms() -> Dict[type, Callable]:
    """Every registered class and its form (a copy)."""
    return dict(_FORMS)


class _GraphForward:
    """The ``forward`` a module runs inside :func:`graph_forms`: its graph form, bound to
    it (a class rather than ``functools.partial`` so that the module appears in reprs)."""

    def __init__(self, form: Callable, module: nn.Module):
        self.form, self.module = form, module

    def __call__(self, *args, **kwargs):
        return self.form(self.module, *args, **kwargs)

    def __repr__(self) -> str:
        return f'<graph form {getattr(self.form, "__name__", self.form)!s} of ' \
               f'{type(self.module).__name__}>'


@contextlib.contextmanager
def graph_forms(model: nn.Module) -> Iterator[List[str]]:
    """Within the ``with`` block every module of ``model`` that has a graph form
    (:func:`graph_form_of`) runs it in place of its ``forward``; on exit each gets its
    own ``forward`` back, also after an error.

    Args:
        model (nn.Module): The model about to be exported.

    Yields:
        list[str]: the names of the modules that take their graph forms.
    """
    swapped: List[Tuple[nn.Module, bool, object]] = []
    names: List[str] = []
    try:
        for name, module in model.named_modules():
            form = graph_form_of(module)
            if form is None:
                continue
            had_own = 'forward' in module.__dict__
            swapped.append((module, had_own, module.__dict__.get('forward')))
            module.forward = _GraphForward(form, module)
            names.append(name)
        yield names
    finally:
        for module, had_own, own in reversed(swapped):
            if had_own:
                module.forward = own
            else:
                del module.forward
