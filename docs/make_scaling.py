"""Prints the tables of docs/scaling.md from `keras_vit.distribution.training_memory`.

    python docs/make_scaling.py            # the estimate and the plan (what fits where at batch 4096)
    KERAS_BACKEND=jax python docs/make_scaling.py --measure   # also XLA's bytes for Ti/16 and S/16

`--measure` compiles one float32 training gradient of each model at batch 2 and 4 with JAX,
without and with `--remat` (`keras_vit.training.remat`), and reads XLA's temporary-buffer size
(`memory_analysis()`); the difference per example is set beside the counted activations. It
needs the JAX backend and a few GB of memory.
"""

import argparse

import keras_vit
from keras_vit.distribution import parameter_counts, training_memory

BATCH = 4096  # the paper's pre-training batch
USABLE = 0.9  # of each device's memory, the rest left to the runtime and fragmentation
# XLA:CPU allocated 1.2x (H/14, g/14) to 2.0x (S/16) the counted activations per example
# (`--measure`); micro-batches are planned for twice the count.
MARGIN = 2.0
# name -> preset; the estimate is at 224 pixels with 1000 classes.
MODELS = {"B/16": "vit_b16", "L/16": "vit_l16", "H/14": "vit_h14", "g/14": "vit_g14"}
# name -> (devices, bytes of memory each, hosts): one process per host, each with devices / hosts.
MACHINES = {
    "8x H100 80 GB": (8, 80e9, 1),
    "TPU v4-32 (16 chips, 32 GiB)": (16, 32 * 2**30, 4),
    "TPU v5e-64 (64 chips, 16 GiB)": (64, 16 * 2**30, 16),
}


def _config(preset):
    return keras_vit.get_config(preset, num_classes=1000)


def plan(config, devices, memory, hosts=1, remat=False):
    """The smallest model-parallel size (dividing each host's devices, as `keras-vit train`
    needs) whose state leaves room for one example per device, then the fewest
    gradient-accumulation steps whose micro-batch fits and makes up the global batch exactly
    (data x micro-batch x steps = BATCH): (data, model, micro_batch, accumulation), or None."""
    ways = 1
    while ways <= devices // hosts:
        fits = (devices // hosts) % ways == 0 and config.hidden_size % ways == 0 and config.mlp_dim % ways == 0
        one = training_memory(config, 1, ways, remat=remat)
        room, example = USABLE * memory - one["state"], MARGIN * one["activations"]
        if fits and room >= example:
            data = devices // ways
            per_device = BATCH // data
            fitting = room // example  # examples per device per step
            steps = next(s for s in range(1, per_device + 1) if per_device % s == 0 and per_device // s <= fitting)
            return data, ways, per_device // steps, steps
        ways *= 2
    return None


def flags(preset, found, hosts, remat=False):
    """The `keras-vit train` flags of a plan (every host adds its --process-id and --job-addresses)."""
    data, ways, micro, steps = found
    words = [f"--preset {preset}"]
    words += [f"--model-parallel {ways}"] if ways > 1 else []
    words += [f"--batch-size {micro}"] + ([f"--accumulate {steps}"] if steps > 1 else [])
    words += ["--remat"] if remat else []
    words += [f"--num-processes {hosts}"] if hosts > 1 else []
    return " ".join(words)


def gigabytes(n):
    return f"{n / 1e9:.1f}"


def estimate_table():
    lines = [
        "| model | parameters | state (GB) | activations per example (MB): float32 | `--remat` | "
        "`--precision mixed_bfloat16` | both |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, preset in MODELS.items():
        config = _config(preset)
        split, other = parameter_counts(config)
        cells = [  # float32, remat, bf16, both
            f"{training_memory(config, 1, remat=remat, precision=precision)['activations'] / 1e6:.0f}"
            for precision in ("float32", "mixed_bfloat16")
            for remat in (False, True)
        ]
        state = training_memory(config, 1)["state"]
        lines.append(f"| {name} | {(split + other) / 1e6:.0f}M | {gigabytes(state)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def planning_table():
    lines = [
        "| model | machine | mesh (data x model) | micro-batch x steps | flags | with `--remat` |",
        "|---|---|---|---|---|---|",
    ]
    for name, preset in MODELS.items():
        config = _config(preset)
        for machine, (devices, memory, hosts) in MACHINES.items():
            found = plan(config, devices, memory, hosts)
            if found is None:
                lines.append(f"| {name} | {machine} | does not fit | | | |")
                continue
            data, ways, micro, steps = found
            remat = plan(config, devices, memory, hosts, remat=True)
            lines.append(
                f"| {name} | {machine} | {data} x {ways} | {micro} x {steps} | `{flags(preset, found, hosts)}` | "
                f"`{flags(preset, remat, hosts, remat=True)}` |"
            )
    return "\n".join(lines)


def tables():
    """The generated part of docs/scaling.md: the estimate, then the plan."""
    return estimate_table() + "\n\n" + planning_table()


def measured_table():
    import jax
    import keras

    from keras_vit.training.remat import rematerialize_blocks

    lines = [
        "| model | counted (MB per example) | XLA:CPU (MB per example) | ratio | `--remat` saves: counted | XLA:CPU |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in ("vit_ti16", "vit_s16"):
        config = keras_vit.get_config(name, num_classes=1000)
        measured, counted = {}, {}
        for remat in (False, True):
            model = keras_vit.ViT(config)
            if remat:
                rematerialize_blocks(model)
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

            measured[remat] = (temporary(4) - temporary(2)) / 2 / 1e6
            counted[remat] = training_memory(config, 1, remat=remat)["activations"] / 1e6
        lines.append(
            f"| {name} | {counted[False]:.1f} | {measured[False]:.1f} | {measured[False] / counted[False]:.2f} | "
            f"{counted[False] - counted[True]:.1f} | {measured[False] - measured[True]:.1f} |"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", action="store_true", help="also compile Ti/16 and S/16 and read XLA's bytes")
    args = parser.parse_args()
    print(tables())
    if args.measure:
        print()
        print(measured_table())


if __name__ == "__main__":
    main()
