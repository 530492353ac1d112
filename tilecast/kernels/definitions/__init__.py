"""Kernel definitions. The import order fixes each kernel's numeric id."""

from tilecast.kernels.definitions import (  # noqa: F401
    gemm,
    elementwise,
    layernorm,
    softmax,
    attention,
    embedding,
    cross_entropy,
    adamw,
    llama,
    attention_softmax,
)
