"""tf.data input pipelines: the official training crop, flips, MixUp/CutMix; evaluation batches
through the model's own image transform.

Random choices come from stateless ops seeded by `config.seed` and each example's place in the
stream, so a run is reproducible even with parallel map calls, and a resumed run augments as
the uninterrupted run would have.
"""

import numpy as np
import tensorflow as tf

from keras_vit.tf_images import to_channels

from . import randaugment

AUTOTUNE = tf.data.AUTOTUNE


def train_pipeline(source, config, image_size, num_classes, global_batch, start_step=0, context=None, channels=3):
    """Batches of (float32 pixels in [0, 255], one-hot labels) from `source` (a
    `datasets.Source`), without end, with `channels` channels (1: grayscale, after the
    augmentations, which run on RGB), beginning at step `start_step` of the run: a run resumed
    there reads the batches it would have read. Each example's random choices are drawn from
    `config.seed` and its place in the stream, each batch's mix from its number (the step,
    where one pipeline feeds all replicas).

    `context`: the `tf.distribute.InputContext` of one of several input pipelines (a
    multi-worker job's workers, `strategy.distribute_datasets_from_function`). That pipeline
    then reads its own part of each global batch (the contiguous part its replicas take when
    one pipeline feeds them all) as per-replica batches, and never decodes the other pipelines'
    examples.

    `image_size` None: `source` holds a linear probe's feature vectors (`probe.py`), batched
    as they are, without augmentation."""
    pipelines, index, replicas = 1, 0, 1
    if context is not None:
        pipelines, index = context.num_input_pipelines, context.input_pipeline_id
        replicas = context.num_replicas_in_sync // pipelines
    share = global_batch // pipelines
    keep = None if pipelines == 1 else (lambda position: position % global_batch // share == index)
    ds = source.passes(config.seed, start_step * global_batch, keep)

    def augment(image, label, position):
        if image_size is None:  # a feature vector
            return image, tf.one_hot(label, num_classes)
        seed = _seed(config.seed, position, 0)
        if config.augment == "translate":
            image = translate(image, image_size, seed)
        elif config.augment == "affine":
            image = affine(image, image_size, seed)
        else:
            image = inception_crop(image, image_size, config.crop_scale, seed)
        if config.flip:
            image = tf.image.stateless_random_flip_left_right(image, seed + 1)
        image = tf.ensure_shape(image, [image_size[0], image_size[1], 3])
        if config.randaugment:
            image = randaugment.rand_augment(image, config.randaugment, _seed(config.seed, position, 2))
        return to_channels(image, channels), tf.one_hot(label, num_classes)

    ds = ds.map(augment, num_parallel_calls=AUTOTUNE, deterministic=True)
    ds = ds.batch(share // replicas, drop_remainder=True)
    if config.mixup > 0 or config.cutmix > 0:
        # The k-th batch here is replica `index * replicas + k % replicas` of step
        # `start_step + k // replicas`; numbered across all pipelines' batches, so none share a mix.
        numbers = tf.data.Dataset.range(np.iinfo(np.int64).max).map(
            lambda k: (start_step + k // replicas) * pipelines * replicas + index * replicas + k % replicas
        )
        ds = tf.data.Dataset.zip((ds, numbers)).map(
            lambda b, number: mix(b, _seed(config.seed, number, 1), config.mixup, config.cutmix),
            num_parallel_calls=AUTOTUNE,
        )
    return ds.prefetch(AUTOTUNE)


def _seed(seed, position, purpose):
    """The stateless seed of the example or batch at `position` of a run seeded `seed`, for
    `purpose` (0: an example's augmentation, 1: a batch's mix, 2: an example's RandAugment):
    no two share one."""
    key = tf.stack([tf.constant(seed, tf.int64), tf.cast(position, tf.int64)])
    return tf.cast(tf.random.experimental.stateless_fold_in(key, purpose), tf.int32)


def eval_pipeline(source_ds, transform, num_classes, batch_size, num_examples=None, multiple=1, channels=3):
    """Batches of images as `channels` channels (1: Pillow's grayscale of them, as `predict`
    reads a file) through `transform` (a model's `image_transform`, see `keras_vit.transform`)
    with one-hot labels, in order, once.

    `multiple` > 1 (data-parallel devices that each need an equal share of every batch): the
    `num_examples` examples get weights 1, then blank examples of weight 0 make the last batch
    a multiple too, so weighted metrics count every example once and no other."""

    def prepare(image, label):
        return transform(to_channels(image, channels)), tf.one_hot(label, num_classes)

    if multiple > 1:
        if num_examples is None:
            raise ValueError("padding for data-parallel devices needs the number of examples.")
        batch_size = -(-batch_size // multiple) * multiple
        ds = source_ds.map(prepare, num_parallel_calls=AUTOTUNE).map(lambda x, y: (x, y, tf.constant(1.0)))
        padding = (-num_examples) % multiple
        if padding:
            blank = ds.take(1).map(lambda x, y, w: (tf.zeros_like(x), tf.zeros_like(y), tf.constant(0.0)))
            ds = ds.concatenate(blank.repeat(padding))
        return ds.batch(batch_size).prefetch(AUTOTUNE)

    return source_ds.map(prepare, num_parallel_calls=AUTOTUNE).batch(batch_size).prefetch(AUTOTUNE)


def inception_crop(image, size, scale, seed):
    """Random crop covering `scale` of the area with aspect ratio in [3/4, 4/3], resized to `size`."""
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image),
        bounding_boxes=tf.zeros([1, 0, 4]),
        seed=seed,
        area_range=scale,
        aspect_ratio_range=(3 / 4, 4 / 3),
        min_object_covered=0.0,
        use_image_if_no_bounding_boxes=True,
    )
    image = tf.slice(image, begin, crop_size)
    return tf.image.resize(tf.cast(image, tf.float32), size, method="bilinear")


def translate(image, size, seed):
    """Resize to `size`, zero-pad by 1/8 of each side and crop `size` back at a random offset."""
    image = tf.image.resize(tf.cast(image, tf.float32), size, method="bilinear")
    pad = [max(1, s // 8) for s in size]
    image = tf.pad(image, [[pad[0], pad[0]], [pad[1], pad[1]], [0, 0]])
    return tf.image.stateless_random_crop(image, [size[0], size[1], 3], seed)


def affine(image, size, seed, rotation=0.2, scale=0.1, shear=0.15, shift=0.125):
    """Resize to `size`, then a random rotation (up to `rotation` radians), zoom (1 +- `scale`),
    horizontal shear (up to `shear`) and shift (up to `shift` of each side) about the centre;
    uncovered pixels are zero."""
    image = tf.image.resize(tf.cast(image, tf.float32), size, method="bilinear")
    u = tf.random.stateless_uniform([5], seed, -1.0, 1.0)
    angle, zoom, k = rotation * u[0], 1.0 + scale * u[1], shear * u[4]
    ty, tx = shift * size[0] * u[2], shift * size[1] * u[3]
    cy, cx = (size[0] - 1) / 2, (size[1] - 1) / 2
    # The image moves by out = zoom * R(angle) @ S(k) @ (in - c) + c + t, S(k) = [[1, k], [0, 1]]
    # in (x, y); the op wants the inverse, the input pixel each output pixel reads:
    # in = S(-k) @ R(-angle) @ (out - c - t) / zoom + c.
    cos, sin = tf.cos(angle) / zoom, tf.sin(angle) / zoom
    a0, a1 = cos + k * sin, sin - k * cos
    b0, b1 = -sin, cos
    ox, oy = cx + tx, cy + ty
    transform = tf.stack([a0, a1, cx - a0 * ox - a1 * oy, b0, b1, cy - b0 * ox - b1 * oy, 0.0, 0.0])
    return randaugment.warp(image, transform, 0.0)


def mix(batch, seed, mixup_alpha, cutmix_alpha):
    """MixUp or CutMix of each batch with its reverse (AugReg); labels mixed in the same
    proportion. With both enabled, each batch picks one at random."""
    images, labels = batch
    seed = tf.cast(seed, tf.int32)
    if mixup_alpha <= 0:
        return _cutmix(images, labels, cutmix_alpha, seed)
    if cutmix_alpha <= 0:
        return _mixup(images, labels, mixup_alpha, seed)
    return tf.cond(
        tf.random.stateless_uniform([], seed) < 0.5,
        lambda: _cutmix(images, labels, cutmix_alpha, seed + 11),
        lambda: _mixup(images, labels, mixup_alpha, seed + 13),
    )


def _mixup(images, labels, alpha, seed):
    lam = _beta(alpha, seed)
    return lam * images + (1 - lam) * tf.reverse(images, [0]), lam * labels + (1 - lam) * tf.reverse(labels, [0])


def _cutmix(images, labels, alpha, seed):
    lam = _beta(alpha, seed)
    shape = tf.shape(images)
    h, w = shape[1], shape[2]
    cut_h = tf.cast(tf.cast(h, tf.float32) * tf.sqrt(1.0 - lam), tf.int32)
    cut_w = tf.cast(tf.cast(w, tf.float32) * tf.sqrt(1.0 - lam), tf.int32)
    cy = tf.random.stateless_uniform([], seed + 2, 0, h, dtype=tf.int32)
    cx = tf.random.stateless_uniform([], seed + 3, 0, w, dtype=tf.int32)
    inside = (tf.abs(tf.range(h)[:, None] - cy) <= cut_h // 2) & (tf.abs(tf.range(w)[None, :] - cx) <= cut_w // 2)
    mask = tf.cast(inside, images.dtype)[None, :, :, None]
    lam = 1.0 - tf.reduce_mean(tf.cast(inside, tf.float32))  # the pasted area decides the label mix
    images = images * (1 - mask) + tf.reverse(images, [0]) * mask
    return images, lam * labels + (1 - lam) * tf.reverse(labels, [0])


def _beta(alpha, seed):
    a = tf.random.stateless_gamma([], seed, alpha=alpha)
    b = tf.random.stateless_gamma([], seed + 7, alpha=alpha)
    return a / (a + b)
