"""Prints the tables of docs/scaling.md from `keras_vit.distribution.training_memory`.

    python docs/make_scaling.py            # the planning table (what fits where at batch 4096)
    KERAS_BACKEND=jax python docs/make_scaling.py --measure   # also XLA's bytes for Ti/16 and S/16

`--measure` compiles one float32 training gradient of each model at batch 2 and 4 with JAX and
reads XLA's temporary-buffer size (`memory_analysis()`); the difference per example is set
beside the counted activations. It needs the JAX backend and a few GB of memory.
"""

import argparse

import keras_vit
from keras_vit.distribution import parameter_counts, training_memory

BATCH = 4096  # the paper's pre-training batch
USABLE = 0.9  # of each device's memory, the rest left to the runtime and fragmentation
# XLA:CPU allocated 1.2x (H/14, g/14) to 2.0x (S/16) the counted activations per example
# (`--measure`); micro-batches are planned for twice the count.
MARGIN = 2.0
G14 = dict(image_size=224, patch_size=14, hidden_size=1408, num_layers=40, num_heads=16, mlp_dim=6144)
MODELS = {
    "B/16": keras_vit.get_config("vit_b16", num_classes=1000),
    "L/16": keras_vit.get_config("vit_l16", num_classes=1000),
    "H/14": keras_vit.get_config("vit_h14", num_classes=1000),
    "g/14": keras_vit.ViTConfig(**G14, num_classes=1000),
}
# name -> (devices, bytes of memory each)
MACHINES = {
    "8x H100 80 GB": (8, 80e9),
    "TPU v4-32 (16 chips, 32 GiB)": (16, 32 * 2**30),
    "TPU v5e-64 (64 chips, 16 GiB)": (64, 16 * 2**30),
}


def plan(config, devices, memory):
    """The smallest model-parallel size whose state leaves room for one example per device,
    then the fewest gradient-accumulation steps whose micro-batch fits and makes up the global
    batch exactly (data x micro-batch x steps = BATCH): (data, model, micro_batch, accumulation),
    or None."""
    ways = 1
    while ways <= devices:
        fits = config.hidden_size % ways == 0 and config.mlp_dim % ways == 0
        one = training_memory(config, 1, ways)
        room, example = USABLE * memory - one["state"], MARGIN * one["activations"]
        if fits and room >= example:
            data = devices // ways
            per_device = BATCH // data
            fitting = room // example  # examples per device per step
            steps = next(s for s in range(1, per_device + 1) if per_device % s == 0 and per_device // s <= fitting)
            return data, ways, per_device // steps, steps
        ways *= 2
    return None


def gigabytes(n):
    return f"{n / 1e9:.1f}"


def planning_table():
    lines = [
        "| model | parameters | state (GB) | activations per example (GB) | " + " | ".join(MACHINES) + " |",
        "|---|---:|---:|---:|" + "---|" * len(MACHINES),
    ]
    for name, config in MODELS.items():
        split, other = parameter_counts(config)
        one = training_memory(config, 1)
        cells = []
        for devices, memory in MACHINES.values():
            found = plan(config, devices, memory)
            if found is None:
                cells.append("does not fit")
                continue
            data, ways, micro, steps = found
            cells.append(f"{data} x {ways}, {micro}/device, {steps} step{'s' if steps > 1 else ''}")
        lines.append(
            f"| {name} | {(split + other) / 1e6:.0f}M | {gigabytes(one['state'])} | "
            f"{gigabytes(one['activations'])} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def measured_table():
    import jax
    import keras

    lines = ["| model | counted (MB per example) | XLA:CPU (MB per example) | ratio |", "|---|---:|---:|---:|"]
    for name in ("vit_ti16", "vit_s16"):
        config = keras_vit.get_config(name, num_classes=1000)
        model = keras_vit.ViT(config)
        trainable = [v.value for v in model.trainable_variables]
        fixed = [v.value for v in model.non_trainable_variables]

        def loss(weights, images, labels, model=model, fixed=fixed):
            logits, _ = model.stateless_call(weights, fixed, images, training=True)
            return keras.ops.mean(keras.losses.categorical_crossentropy(labels, logits, from_logits=True))

        def temporary(batch, config=config, trainable=trainable, loss=loss):
            images = jax.ShapeDtypeStruct((batch, *config.image_size, 3), "float32")
            labels = jax.ShapeDtypeStruct((batch, 1000), "float32")
            compiled = jax.jit(jax.grad(loss)).lower(trainable, images, labels).compile()
            return compiled.memory_analysis().temp_size_in_bytes

        measured = (temporary(4) - temporary(2)) / 2
        counted = training_memory(config, 1)["activations"]
        lines.append(f"| {name} | {counted / 1e6:.1f} | {measured / 1e6:.1f} | {measured / counted:.2f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", action="store_true", help="also compile Ti/16 and S/16 and read XLA's bytes")
    args = parser.parse_args()
    print(planning_table())
    if args.measure:
        print()
        print(measured_table())


if __name__ == "__main__":
    main()
