"""Half-precision training attention on JAX GPUs for an odd token count (197 in ViT-B/16).

JAX's cuDNN flash attention (0.10-0.11) refuses odd sequence lengths in training, and Keras then
falls back to XLA's attention, which writes the (tokens x tokens) probabilities out. So the
tokens are padded by one and cuDNN is given the true lengths (its padding mask); the pad's query
row is dropped after. A boolean key mask would reach cuDNN as a bias instead, whose forward and
backward ran slower: ViT-B/16 bf16 `fit` at batch 256 on an H200, 3,233 against 3,392 images/s
(docs/performance.md). Imported only on the JAX backend.
"""

import jax
import jax.numpy as jnp
from keras import ops


def padded_attention(q, k, v, implementation="cudnn"):
    """`dot_product_attention` of (batch, tokens, heads, head_dim) arrays, computed on one
    padding token more with the true lengths passed to `jax.nn.dot_product_attention`'s
    `implementation`; Keras's own attention where that implementation refuses the inputs."""
    tokens = q.shape[1]
    padded = [jnp.pad(t, ((0, 0), (0, 1), (0, 0), (0, 0))) for t in (q, k, v)]
    lengths = jnp.full(q.shape[:1], tokens, jnp.int32)
    try:
        out = jax.nn.dot_product_attention(
            *padded, query_seq_lengths=lengths, key_value_seq_lengths=lengths, implementation=implementation
        )
    except (NotImplementedError, RuntimeError, ValueError):  # e.g. no cuDNN, or its version too old
        return ops.dot_product_attention(q, k, v)
    return out[:, :tokens]
