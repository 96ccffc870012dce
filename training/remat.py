"""Rematerialisation: each encoder block recomputed in the backward pass (`jax.checkpoint`).

The backward pass then keeps only each block's input instead of everything inside it
(LayerNorm outputs, q, k, v, attention probabilities, the MLP's hidden activations), and
recomputes one block at a time: one more forward pass of the blocks for a fraction of the
activation memory (docs/scaling.md). Gradients equal those without it to float rounding (test).

Keras's own `keras.RematScope(mode="list_of_layers")` is not used: under JAX it traces the
block's Python arguments (`training`, `return_attention_scores`) as arrays, which the layers
cannot branch on, and dropout's generator state would leave the checkpointed trace. Here the
block runs as a pure function of its weights, its generators' states and its input, with the
Python arguments fixed, and the new generator states are assigned outside.
"""

import keras

from keras_vit.layers import EncoderBlock


def check_backend():
    """Raises a one-line ValueError on a backend other than JAX, the one that rematerialises here."""
    if keras.backend.backend() != "jax":
        raise ValueError(
            f"--remat (rematerialisation) runs under the JAX backend (KERAS_BACKEND=jax); this is "
            f"{keras.backend.backend()}."
        )


def rematerialize_blocks(model):
    """Makes every `EncoderBlock` of `model` recompute its activations in the backward pass;
    returns how many. Its weights, outputs and saved files are unchanged."""
    check_backend()
    blocks = [layer for layer in model.layers if isinstance(layer, EncoderBlock)]
    for block in blocks:
        block.call = _checkpointed(block, block.call)
    return len(blocks)


def _checkpointed(block, call):
    import jax

    def checkpointed_call(x, training=None, return_attention_scores=False, grid=None):
        weights, states = block.trainable_variables, block.non_trainable_variables

        def pure(weight_values, state_values, x, grid):
            mapping = list(zip(weights, weight_values)) + list(zip(states, state_values))
            with keras.StatelessScope(state_mapping=mapping) as scope:
                outputs = call(x, training=training, return_attention_scores=return_attention_scores, grid=grid)
            return outputs, [scope.get_current_value(v) for v in states]

        outputs, new_states = jax.checkpoint(pure)([v.value for v in weights], [v.value for v in states], x, grid)
        for variable, value in zip(states, new_states):
            variable.assign(value)
        return outputs

    return checkpointed_call
