from .pola_attention import (pola_linear_attention,
                             pola_linear_attention_reference,
                             polarity_features)

__all__ = [
    'pola_linear_attention', 'pola_linear_attention_reference',
    'polarity_features'
]
from .attention_weights import attention_entropy, pola_attention_weights, pola_exponent  # noqa
