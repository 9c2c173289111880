from .attention_weights import attention_entropy, pola_attention_weights
from .blocked_mlp import mlp_gelu
from .depthwise_conv import depthwise_conv2d
from .pola_attention import (ALPHA_MAX, BACKENDS, check_alpha, pola_exponent, pola_linear_attention,
                             pola_linear_attention_naive, pola_linear_attention_reference,
                             polarity_features, set_default_backend)

__all__ = [
    'ALPHA_MAX', 'BACKENDS', 'pola_linear_attention', 'pola_linear_attention_naive',
    'pola_linear_attention_reference', 'polarity_features', 'set_default_backend', 'pola_exponent',
    'check_alpha', 'pola_attention_weights', 'attention_entropy', 'depthwise_conv2d', 'mlp_gelu'
]
