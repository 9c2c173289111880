"""The attention maths as functions, and the fused layers the backbones use.

:func:`pola_linear_attention` (with :func:`set_default_backend`, :data:`BACKENDS` and the
bound :data:`ALPHA_MAX` of its ``alpha``), the explicit weights of chosen queries and their
entropy (:func:`pola_attention_weights`, :func:`attention_entropy`, with the learned
exponent :func:`pola_exponent`), and the fused layers :func:`depthwise_conv2d` and
:func:`mlp_gelu`. The op is the folder :mod:`polaformer_mm.ops.pola_attention`: its maths in
:mod:`~polaformer_mm.ops.pola_attention.formulation`, the reference forms in
:mod:`~polaformer_mm.ops.pola_attention.reference`.
"""
from .attention_weights import attention_entropy, pola_attention_weights
from .blocked_mlp import mlp_gelu
from .depthwise_conv import depthwise_conv2d
from .pola_attention import (ALPHA_MAX, BACKENDS, pola_exponent, pola_linear_attention,
                             set_default_backend)

__all__ = [
    'pola_linear_attention', 'set_default_backend', 'BACKENDS', 'ALPHA_MAX',
    'pola_attention_weights', 'attention_entropy', 'pola_exponent', 'depthwise_conv2d', 'mlp_gelu'
]
