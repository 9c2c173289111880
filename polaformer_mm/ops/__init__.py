from .pola_attention import (BACKENDS, pola_linear_attention, pola_linear_attention_naive,
                             pola_linear_attention_reference, polarity_features,
                             set_default_backend)

__all__ = [
    'BACKENDS', 'pola_linear_attention', 'pola_linear_attention_naive',
    'pola_linear_attention_reference', 'polarity_features', 'set_default_backend'
]
from .attention_weights import attention_entropy, pola_attention_weights, pola_exponent  # noqa
