"""Data sources: scikit-learn's digits, an image folder, or any tensorflow-datasets dataset.

Each yields decoded uint8 images `(H, W, 3)` and integer labels as tf.data datasets, plus the
class names; the pipeline (`pipeline.py`) crops, augments and batches them. Disjoint parts:
`train`, `eval` (the reported accuracy, never looked at during training) and, when asked for,
`select` (held out of the training examples to choose `best.keras`). Training reads
`Source.passes`: pass after pass over the training split, each in an order drawn from the
seed and the pass's number, so a resumed run reads on from where it stopped.
"""

import collections
import dataclasses
import difflib
import hashlib
import json
import logging
import os
import re
import socket
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tensorflow as tf

from keras_vit import folders
from keras_vit.names import IMAGE_EXTENSIONS, UNREAD_IMAGE_EXTENSIONS, UNREAD_IMAGES_WARNING, WHOLE_SPLIT, cache_home
from keras_vit.tf_images import decode_image

logger = logging.getLogger("keras_vit")
# Records permuted together for a source that cannot be shuffled whole: a tfds split's, still
# encoded (ImageNet: about 1.1 GB a window, two in memory as the next is read; decoded, 10,000
# such images would take about 5 GB).
SHUFFLE_BUFFER = 10_000
_WARNED = set()  # the folder warnings given: (message, arguments)


def _warn_once(message, *args):
    """Logs a warning once per process (`fit` reads a folder again to evaluate)."""
    if (message, *map(str, args)) not in _WARNED:
        _WARNED.add((message, *map(str, args)))
        logger.warning(message, *args)


_FOREVER = np.iinfo(np.int64).max


@dataclasses.dataclass
class Source:
    records: tf.data.Dataset  # the training split as stored: (record, int label), a record decoded by `decode`
    eval: tf.data.Dataset  # (uint8 image (H, W, 3), int label)
    class_names: list
    num_train: int
    num_eval: int
    select: tf.data.Dataset | None = None  # None: no selection split (best.keras is the last epoch)
    num_select: int = 0
    skipped: int = 0  # unreadable files left out
    fingerprint: str | None = None  # an image folder's readable files, as `_fingerprint` gives it
    decode: object = None  # record -> uint8 image (H, W, 3); None: the records are images
    shuffle_buffer: int | None = None  # records permuted together in a pass; None: the whole split
    drop_undecodable: bool = False  # a record `decode` fails on is stepped over (a folder's broken JPEG)

    @property
    def train(self):
        """One pass over the training split, as stored: (uint8 image, int label)."""
        examples = self.records.map(lambda record, label: ((record, label), tf.constant(0, tf.int64)))
        return self._decoded(examples).map(lambda image, label, _: (image, label))

    def passes(self, seed, start=0, keep=None):
        """The training examples, pass after pass without end, as (uint8 image, int label,
        position), beginning at example `start` of that stream; with `keep` (a function of the
        position giving a boolean tensor) only the examples it keeps, the others never decoded.
        Each pass cuts the split as stored into windows of `shuffle_buffer` records (one window:
        the whole split) and permutes each window by a stateless seed of `seed`, the pass and
        the window, before decoding. `position` is an example's place in the stream, for random
        choices that depend on nothing else. Starting at `start` reads the records of its pass
        before it, none of earlier passes; an undecodable record stepped over shifts the
        examples after it by one."""
        if self.num_train == 0:
            raise ValueError("the training split has no examples.")
        window = min(self.shuffle_buffer or self.num_train, self.num_train)

        # Records of several shapes (images tfds stores decoded) travel in ragged windows.
        fixed = all(spec.shape.is_fully_defined() for spec in self.records.element_spec)

        def permuted(number, index, records):
            key = tf.random.experimental.stateless_fold_in(tf.stack([tf.cast(seed, tf.int64), number]), index)
            order = tf.random.experimental.stateless_shuffle(tf.range(tf.shape(records[1])[0]), key)
            examples = tf.data.Dataset.from_tensor_slices(tuple(tf.gather(part, order) for part in records))
            if fixed:
                return examples
            return examples.map(lambda record, label: (_dense(record), label))

        def one_pass(number, first_window=0):
            records = self.records.skip(first_window * window) if first_window else self.records
            windows = records.batch(window) if fixed else records.ragged_batch(window)
            # The next window is read while this one is used: no wait at each window's start.
            windows = windows.prefetch(1).enumerate(start=first_window)
            return windows.flat_map(lambda index, records: permuted(number, index, records))

        # The first pass from its window holding `start`: earlier windows are read, not permuted.
        first, offset = divmod(start, self.num_train)
        first_window, offset = divmod(offset, window)
        stream = one_pass(tf.constant(first, tf.int64), first_window).skip(offset)
        stream = stream.concatenate(tf.data.Dataset.range(first + 1, _FOREVER).flat_map(one_pass))
        stream = tf.data.Dataset.zip(stream, tf.data.Dataset.range(start, _FOREVER))
        if keep is not None:
            stream = stream.filter(lambda example, position: keep(position))
        return self._decoded(stream)

    def _decoded(self, ds):
        """((record, label), position) -> (image, label, position)."""
        decode = self.decode or (lambda record: record)
        ds = ds.map(
            lambda example, position: (decode(example[0]), example[1], position),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        return ds.ignore_errors() if self.drop_undecodable else ds


def _dense(record):
    return record.to_tensor() if isinstance(record, tf.RaggedTensor) else record


def load(config):
    """The `Source` for `config.dataset`: "digits", "tfds:NAME" or a folder path."""
    whole = config.eval_split == WHOLE_SPLIT  # every image evaluated, none trained on
    if config.eval_split is not None and not whole and not config.dataset.startswith("tfds:"):
        raise ValueError(
            f"a split expression ({config.eval_split!r}) is for tfds datasets; {config.dataset}'s evaluation split is "
            f"its held-out share, or {WHOLE_SPLIT!r} for every image."
        )
    if config.train_split is not None and not config.dataset.startswith("tfds:"):
        raise ValueError(
            f"a training split ({config.train_split!r}) is for tfds datasets; {config.dataset} trains on all but its "
            "held-out share (its validation fraction)."
        )
    fraction = 1.0 if whole else config.validation_fraction
    if config.dataset == "digits":
        return digits(fraction, config.seed, config.selection_fraction)
    if config.dataset.startswith("tfds:"):
        return tfds_source(config.dataset[5:], config.train_split, config.eval_split, config.selection_fraction)
    path = Path(config.dataset)
    if config.dataset.strip() and path.is_dir():  # Path("") is the working directory
        return folder(path, fraction, config.seed, config.selection_fraction, config.data_fingerprint)
    if path.is_file():
        raise ValueError(f"dataset {config.dataset!r} is a file; an image folder holds one sub-folder per class.")
    if "/" in config.dataset or os.sep in config.dataset:
        raise ValueError(
            f"no folder {config.dataset!r}: a dataset is 'digits', 'tfds:NAME' or an image folder "
            "(one sub-folder per class)."
        )
    if _is_tfds_name(config.dataset):
        raise ValueError(f"unknown dataset {config.dataset!r}; did you mean tfds:{config.dataset}?")
    raise ValueError(
        f"unknown dataset {config.dataset!r}: use 'digits', 'tfds:NAME' or an image folder (one sub-folder per class)."
    )


def digits(validation_fraction=0.2, seed=0, selection_fraction=0.0):
    """scikit-learn's bundled handwritten digits (1,797 real 8x8 images, no download), as RGB
    pixels in [0, 255]; a stratified `validation_fraction` is held out for evaluation, and
    `selection_fraction` of the rest for choosing the best epoch."""
    from sklearn.datasets import load_digits

    data = load_digits()
    images = np.round(data.images * (255.0 / 16.0)).astype(np.uint8)[..., None].repeat(3, axis=-1)
    train, select, held_out = _three_way_split(data.target, validation_fraction, selection_fraction, seed)

    def dataset(index):
        return tf.data.Dataset.from_tensor_slices((images[index], data.target[index]))

    return Source(
        dataset(train),
        dataset(held_out),
        [str(d) for d in range(10)],
        len(train),
        len(held_out),
        dataset(select) if len(select) else None,
        len(select),
    )


def folder(path, validation_fraction=0.2, seed=0, selection_fraction=0.0, fingerprint=None):
    """One sub-folder per class of JPEG/PNG/BMP/GIF/WebP files, split as `digits` is; grayscale,
    CMYK, palette and RGBA images become RGB. `fingerprint`: the readable files' fingerprint when
    the run split the folder (`Source.fingerprint`); a folder that no longer has it is refused.

    Files are listed in parallel and checked by TensorFlow in a parallel tf.data pass (see
    `_decodable`), so unreadable files are skipped, and counted in one warning,
    before training without a file-by-file pre-pass; the verdicts are cached (see
    `FolderIndex`) and later commands check only new or changed files. Training reads files
    in an order shuffled whole every pass and decodes them as it goes: no decoded image waits
    in a shuffle buffer, so memory does not grow with the folder or its images' size."""
    path = Path(path)
    entries = [p for p in path.iterdir() if not p.name.startswith(".")]
    # A class folder may be a link (datasets are often assembled from links): `is_dir` follows it.
    classes = sorted(p.name for p in entries if p.is_dir())
    dangling = sorted(p.name for p in entries if p.is_symlink() and not p.exists())
    if dangling:  # a class folder's link that lost its target
        _warn_once(
            "keras_vit: skipped %d link(s) to nothing in %s (moved class folders?), e.g. %s",
            len(dangling),
            path,
            dangling[0],
        )
    if not classes:
        raise ValueError(f"{path} has no class sub-folders (expected {path}/CLASS_NAME/image.jpg).")
    for name in classes:  # each becomes one line of labels.txt
        if name.splitlines() != [name] or not _is_utf8(name):
            raise ValueError(f"{path}: rename the class folder {name!r}; a class name is one line of UTF-8 text.")
    listed, unread = _list_images(path, classes)
    if unread:
        _warn_once(
            UNREAD_IMAGES_WARNING,
            sum(unread.values()),
            path,
            ", ".join(sorted(unread)),
        )
    if not listed:
        raise ValueError(f"{path} has no readable images ({', '.join(IMAGE_EXTENSIONS)}) in its class folders.")
    index = FolderIndex(path)
    verdicts = index.check(listed)
    readable = [(name, label) for name, label, _ in listed if verdicts[name]]
    skipped = [name for name, _, _ in listed if not verdicts[name]]
    if not readable:
        raise ValueError(f"{path} has no readable images ({', '.join(IMAGE_EXTENSIONS)}) in its class folders.")
    empty = [name for label, name in enumerate(classes) if label not in {label for _, label in readable}]
    if empty:
        raise ValueError(
            f"{path}: class folder(s) without readable images ({', '.join(IMAGE_EXTENSIONS)}): "
            f"{', '.join(empty[:5])}; add images or remove them."
        )
    if skipped:
        _warn_once("keras_vit: skipped %d unreadable image(s) in %s, e.g. %s", len(skipped), path, skipped[0])
    now = _fingerprint(readable)
    if fingerprint is not None and fingerprint != now:
        then = _fingerprint_count(fingerprint)
        then = "other images" if then is None else f"{then} images"
        raise ValueError(
            f"{path} has changed since the run split it ({then} then, {len(readable)} images now), "
            "so which images it held out can no longer be told: put the folder back as it was; evaluate on images "
            "the model never saw (--dataset FOLDER --split all); or train anew (--overwrite)."
        )
    files = _tensor_paths([path / name for name, _ in readable])
    labels = np.array([label for _, label in readable])
    train, select, held_out = _three_way_split(labels, validation_fraction, selection_fraction, seed)
    # Evaluation and selection count every image they hold, so theirs are decoded whole (once: the
    # index keeps it). A JPEG broken inside its pixel data passes the first check; it is left out
    # of them here (the split stays as drawn) and stepped over in training.
    broken = index.check_whole([readable[i][0] for i in (*select, *held_out)])
    if broken:
        select, held_out = ([i for i in split if readable[i][0] not in broken] for split in (select, held_out))
        _warn_once(
            "keras_vit: left %d image(s) of %s that do not decode whole out of evaluation and selection, e.g. %s",
            len(broken),
            path,
            min(broken),
        )
    if not len(held_out):
        raise ValueError(
            f"{path} has too few images to hold out an evaluation split: a class needs at least 2 readable images."
        )
    unevaluated = sorted(set(range(len(classes))) - set(labels[held_out].tolist()))
    if unevaluated:
        _warn_once(
            "keras_vit: %d class(es) of %s have too few images for one in the evaluation split, e.g. %s",
            len(unevaluated),
            path,
            classes[unevaluated[0]],
        )

    def dataset(index):
        return tf.data.Dataset.from_tensor_slices((files[index], labels[index]))

    def images(index):
        return dataset(index).map(lambda f, y: (_decode_file(f), y), num_parallel_calls=tf.data.AUTOTUNE)

    # Training shuffles the file names whole, which is cheap, and decodes each image as it is read:
    # no decoded image waits in a shuffle buffer.
    return Source(
        dataset(train),
        images(held_out),
        classes,
        len(train),
        len(held_out),
        images(select) if len(select) else None,
        len(select),
        skipped=len(skipped),
        fingerprint=now,
        decode=_decode_file,
        # A JPEG broken inside its pixel data can pass the first check: training steps over it.
        drop_undecodable=True,
    )


class FolderIndex:
    """Which files of an image folder TensorFlow can decode, remembered between commands.

    Kept beside the data (`.keras_vit_index.json`) or, in a read-only folder, in
    `$KERAS_HOME/keras_vit/folders/`. A file is checked again when its size or modification
    time changes."""

    NAME = ".keras_vit_index.json"
    VERSION = 2  # 2: palette BMPs of 1 and 4 bits decode (tf_images); files checked before are checked again
    # An entry: [size, mtime_ns, readable] and, once the file was decoded whole, whether it did (0/1).

    def __init__(self, path):
        self.path = Path(path)
        self.file = self.path / self.NAME
        if not os.access(self.path, os.W_OK):
            digest = hashlib.sha256(str(self.path.resolve()).encode()).hexdigest()[:16]
            self.file = cache_home() / "folders" / f"{digest}.json"

    def check(self, listed):
        """`{relative name: readable}` for `listed` `(name, label, (size, mtime_ns))` entries."""
        known = self._read()
        verdicts, unknown = {}, []
        for name, _, stamp in listed:
            entry = known.get(name)
            if stamp is None:  # a link to nothing
                verdicts[name] = False
            elif entry is not None and entry[:2] == list(stamp):
                verdicts[name] = bool(entry[2])
            else:
                unknown.append(name)
        if unknown:
            good = _decodable(_tensor_paths([self.path / name for name in unknown]))
            verdicts.update({name: i in good for i, name in enumerate(unknown)})
            stamps = {name: stamp for name, _, stamp in listed if stamp is not None}
            entries = {name: known[name] for name in stamps if name in known}  # kept whole: a 4th item stays
            entries.update({name: [*stamps[name], int(verdicts[name])] for name in unknown})
            self._write(entries)
        return verdicts

    def check_whole(self, names):
        """The files among `names` (readable by `check`) that fail to decode whole, each file
        decoded once: the verdict is kept as an entry's fourth item (1: whole, 0: broken)."""
        known = self._read()
        verdicts = {name: known[name][3] for name in names if len(known.get(name, ())) >= 4}
        unknown = [name for name in names if name not in verdicts]
        if unknown:
            good = _decodable(_tensor_paths([self.path / name for name in unknown]), whole=True)
            verdicts.update({name: int(i in good) for i, name in enumerate(unknown)})
            known.update({name: [*known[name][:3], verdicts[name]] for name in unknown if name in known})
            self._write(known)
        return {name for name in names if not verdicts[name]}

    def _read(self):
        try:
            data = json.loads(self.file.read_text())
            return data["files"] if data.get("version") == self.VERSION else {}
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    def _write(self, files):
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.file.with_name(self.file.name + f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps({"version": self.VERSION, "files": files}))
            os.replace(temporary, self.file)
        except OSError as error:  # a cache only: the next command checks again
            logger.warning("keras_vit: cannot write the folder index %s (%s)", self.file, error)


def _list_images(path, classes):
    """`(name relative to path, label, (size, mtime_ns), or None for a broken link)` of every
    image not hidden (no name starting with a dot), class folders listed in parallel threads, in
    a stable order; and a Counter by suffix of the files left out (`UNREAD_IMAGE_EXTENSIONS`).
    Links are followed, to folders (a class folder itself, or folders in it) and to files alike,
    as `folder` finds its class folders; a folder reached twice (a link loop, a link back to the
    dataset) is listed once per class, the dataset's own folder never."""

    def walk(label_and_name):
        label, name = label_and_name
        found, unread = [], collections.Counter()
        for root, names in folders.walk(path / name, seen={folders.folder_key(path)}):
            for file in names:
                suffix = Path(file).suffix.lower()
                if suffix in UNREAD_IMAGE_EXTENSIONS and not file.startswith("."):
                    unread[suffix] += 1
                if suffix in IMAGE_EXTENSIONS and not file.startswith("."):  # not macOS's ._x.jpg
                    full = os.path.join(root, file)
                    try:
                        status = os.stat(full)
                    except OSError:  # a broken link: skipped as unreadable
                        stamp = None
                    else:  # not a regular file (a named pipe would block the check): skipped as unreadable
                        stamp = (status.st_size, status.st_mtime_ns) if stat.S_ISREG(status.st_mode) else None
                    found.append((os.path.relpath(full, path), label, stamp))
        return sorted(found), unread

    with ThreadPoolExecutor(max_workers=min(16, len(classes))) as pool:
        walked = list(pool.map(walk, enumerate(classes)))
    unread = sum((counts for _, counts in walked), collections.Counter())
    return [entry for entries, _ in walked for entry in entries], unread


def _fingerprint(readable):
    """ "N images, sha256 HEX" of a folder's readable `(name, label)` files, which decide its split.
    Recorded as this text in a run's config.yaml and in the files exported from it (their
    `data_split`), and compared whole."""
    digest = hashlib.sha256()
    for name, _ in sorted(readable):
        digest.update(os.fsencode(name) + b"\0")
    return f"{len(readable)} images, sha256 {digest.hexdigest()[:16]}"


def _fingerprint_count(fingerprint):
    """The image count of a fingerprint `_fingerprint` made, or None for any other value (a
    hand-edited config.yaml)."""
    match = re.fullmatch(r"(\d+) images, sha256 [0-9a-f]{16}", fingerprint) if isinstance(fingerprint, str) else None
    return int(match.group(1)) if match else None


def _is_utf8(name):
    """Whether a file name is UTF-8 (Python keeps other bytes as surrogates, which do not encode)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _tensor_paths(paths):
    """File paths as the bytes the file system holds, for TensorFlow: a name that is not UTF-8
    (which Python keeps as surrogates) cannot become a string tensor as `str`."""
    return np.array([os.fsencode(p) for p in paths], dtype=object)


def _decodable(files, whole=False):
    """Indices of `files` that TensorFlow reads, checked in parallel. A JPEG whose markers are
    whole (it starts with SOI, its header parses and it ends with EOI, which a truncated file
    lacks) passes without decoding its pixels unless `whole`; any other file is decoded in full.
    A JPEG broken only inside its entropy-coded data can pass; training then skips it
    (`_decode_file`)."""

    def check(i, file):
        data = tf.io.read_file(file)
        if whole:
            return i, tf.shape(decode_image(data))[0]
        whole_jpeg = tf.io.is_jpeg(data) & tf.equal(tf.strings.substr(data, -2, 2), b"\xff\xd9")
        rows = tf.cond(
            whole_jpeg,
            lambda: tf.image.extract_jpeg_shape(data)[0],
            lambda: tf.shape(decode_image(data))[0],
        )
        return i, rows

    ds = tf.data.Dataset.from_tensor_slices((np.arange(len(files)), np.array(files)))
    ds = ds.map(check, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False).ignore_errors()
    return {int(i) for batch, _ in ds.batch(4096).as_numpy_iterator() for i in batch}


def _class_names(name, builder, tfds):
    """The class names of a tfds dataset's supervised label (`as_supervised` reads `(image, label)`
    by its `supervised_keys`: smallnorb's label is `label_category`); a ValueError for a dataset
    whose supervised pair is not an image and a class label."""
    keys = builder.info.supervised_keys
    features = builder.info.features
    pair = keys if isinstance(keys, tuple) and len(keys) == 2 and all(isinstance(k, str) for k in keys) else None
    if pair is None or not (
        isinstance(features[pair[0]], tfds.features.Image) and isinstance(features[pair[1]], tfds.features.ClassLabel)
    ):
        raise ValueError(
            f"tfds:{name} is not an image classification dataset (an image and a class label as its supervised "
            f"keys): its supervised keys are {keys}, its features {', '.join(features.keys())}."
        )
    return features[pair[1]].names


def _is_tfds_name(name):
    """Whether `name` (without `tfds:`) names a tensorflow-datasets builder."""
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        return False
    return name.split(":")[0] in tfds.list_builders(with_community_datasets=False)


def _unknown_config(builder_class, name, error):
    """One line for `name` (`NAME[/CONFIG][:VERSION]`) that tfds refused with `error`: the
    config it does not have and the ones it has (tfds lists only close matches, often none), else
    the end of tfds's own message (an unknown version: the versions it has)."""
    base, _, config = name.partition("/")
    config = config.split(":")[0]
    configs = [c.name for c in getattr(builder_class, "BUILDER_CONFIGS", None) or []]
    if not config or config in configs:  # 'Failed to construct dataset "X", builder_kwargs "{...}": Dataset X ...'
        said = str(error).splitlines()[0].rpartition('": ')[2]
        return f"tfds:{name}: {said}"
    if not configs:
        return f"tfds:{base} has no configs: use tfds:{base} (not tfds:{name})."
    close = difflib.get_close_matches(config, configs, n=3)
    hint = f"did you mean {', '.join(f'tfds:{base}/{c}' for c in close)}? " if close else ""
    listed = ", ".join(configs[:10]) + (f" and {len(configs) - 10} more" if len(configs) > 10 else "")
    return f"tfds:{base} has no config {config!r}; {hint}its configs: {listed}."


def tfds_source(name, train_split=None, eval_split=None, selection_fraction=0.0):
    """A tensorflow-datasets image-classification dataset; the selection split is the last
    `selection_fraction` of the training split (`selection_splits`). Not prepared and offline:
    a clear error within seconds (tfds itself would retry for minutes). Training shuffles the
    training split in a buffer of `SHUFFLE_BUFFER` records read as stored (images still encoded
    where tfds stores them so)."""
    import tensorflow_datasets as tfds

    known = tfds.list_builders(with_community_datasets=False)
    base = name.split("/")[0].split(":")[0]
    if base not in known:
        close = difflib.get_close_matches(base, known, n=3)
        hint = f"; did you mean {', '.join('tfds:' + c for c in close)}?" if close else "."
        raise ValueError(f"unknown tensorflow-datasets dataset {name!r}{hint}")
    # tfds warns through absl that a missing version folder has no dataset_info.json; the error
    # below says what to do instead.
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        builder = tfds.builder(name, try_gcs=False)
        prepared = builder.is_prepared()
    except (ValueError, AssertionError) as error:  # an unknown config (tfds lists none) or version
        raise ValueError(_unknown_config(tfds.builder_cls(base), name, error)) from None
    finally:
        absl_logger.setLevel(level)
    if not prepared:
        if not network_available():
            manual = (
                " (it needs a manual download into ~/tensorflow_datasets/downloads/manual)"
                if getattr(builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None)
                else ""
            )
            raise ValueError(
                f"tfds:{name} is not prepared in {builder.data_dir} and this machine is offline; "
                f"run `tfds build {name}` where there is internet{manual} and copy the "
                "tensorflow_datasets folder here (or set TFDS_DATA_DIR)."
            )
        builder.download_and_prepare()
    names = _class_names(name, builder, tfds)
    splits = list(builder.info.splits.keys())
    train_split = train_split or "train"
    eval_split = eval_split or next((s for s in ("test", "validation") if s in splits), "train[90%:]")
    if eval_split == "train[90%:]" and train_split == "train":
        train_split = "train[:90%]"
    train_split, select_split = selection_splits(train_split, selection_fraction)
    to_rgb = _to_rgb
    decoders = None
    image_key = (builder.info.supervised_keys or (None,))[0]
    feature = builder.info.features[image_key] if isinstance(image_key, str) else None
    if isinstance(feature, tfds.features.Image) and feature.np_dtype == np.uint8:
        # The stored bytes, decoded as folders and the SavedModel decode them (JPEGs with the
        # exact IDCT, as Pillow); tfds's own decoder takes TensorFlow's fast IDCT.
        to_rgb, decoders = decode_image, {image_key: tfds.decode.SkipDecoding()}
    datasets, counts = [], []
    for split in (train_split, eval_split, select_split):
        if split is None:
            datasets.append(None)
            counts.append(0)
            continue
        ds = builder.as_dataset(split=split, as_supervised=True, shuffle_files=False, decoders=decoders)
        try:
            counts.append(builder.info.splits[split].num_examples)
        except KeyError:  # no split metadata (e.g. under tfds.testing.mock_data): count
            counts.append(int(ds.reduce(0, lambda n, _: n + 1)))
        if split != train_split:  # the training split is decoded as `Source.passes` reads it
            ds = ds.map(lambda x, y: (to_rgb(x), y), num_parallel_calls=tf.data.AUTOTUNE)
        datasets.append(ds)
    if select_split is not None and counts[2] == 0:
        logger.warning("keras_vit: the selection split %s is empty; best.keras will be the last epoch", select_split)
        datasets[2] = None
    return Source(
        datasets[0],
        datasets[1],
        list(names),
        counts[0],
        counts[1],
        datasets[2],
        counts[2],
        decode=to_rgb,
        shuffle_buffer=SHUFFLE_BUFFER,
    )


def selection_splits(train_split, fraction):
    """`(train, select)` tfds splits: the last `fraction` (whole percents, at least 1) of
    `NAME` or `NAME[:P%]` held out; `(train_split, None)` for a fraction of 0."""
    if fraction == 0:
        return train_split, None
    match = re.fullmatch(r"(\w+)(?:\[:(\d+)%\])?", train_split)
    if not match:
        raise ValueError(
            f"cannot hold a selection split out of the tfds split {train_split!r}: use a split "
            "like 'train' or 'train[:90%]', or no selection split (--selection-fraction 0: best.keras "
            "is then the last epoch)."
        )
    name, end = match.group(1), int(match.group(2) or 100)
    cut = end - max(1, round(end * fraction))
    if cut < 1:
        raise ValueError(f"the selection fraction {fraction} leaves nothing of {train_split!r} to train on.")
    return f"{name}[:{cut}%]", f"{name}[{cut}%:{end}%]"


def network_available(host="storage.googleapis.com", timeout=3.0):
    """Whether the dataset host answers within `timeout` seconds."""
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _decode_file(path):
    return decode_image(tf.io.read_file(path))


def _to_rgb(image):
    image = tf.convert_to_tensor(image)
    if image.shape[-1] == 1:
        image = tf.image.grayscale_to_rgb(image)
    return tf.cast(image, tf.uint8)


def _three_way_split(labels, eval_fraction, selection_fraction, seed):
    """Indices (train, select, eval): `eval_fraction` of every class held out for evaluation,
    then `selection_fraction` of every class's remainder for selection."""
    rest, held_out = _stratified_split(labels, eval_fraction, seed)
    if selection_fraction == 0:
        return rest, np.array([], dtype=int), held_out
    train, select = _stratified_split(labels[rest], selection_fraction, seed + 1)
    return rest[train], rest[select], held_out


def _stratified_split(labels, fraction, seed):
    """Indices (train, held_out): `fraction` of every class held out, shuffled with `seed`
    (fraction 1: every index held out)."""
    if fraction >= 1.0:
        return np.array([], dtype=int), _interleaved(np.arange(len(labels)), labels)
    rng = np.random.default_rng(seed)
    train, held_out = [], []
    for label in np.unique(labels):
        index = rng.permutation(np.flatnonzero(labels == label))
        cut = max(1, int(round(len(index) * fraction))) if len(index) > 1 else 0
        held_out += list(index[:cut])
        train += list(index[cut:])
    return np.array(sorted(train), dtype=int), _interleaved(np.array(held_out, dtype=int), labels)


def _interleaved(index, labels):
    """`index` in an order whose every prefix holds the classes in about their shares of the
    whole (a folder lists its classes one after another), each class in ascending index order:
    the first N held-out images, as an export checks them, are a stratified sample."""
    index = np.sort(index)
    of = labels[index]
    rank = np.zeros(len(index))
    for label in np.unique(of):
        members = np.flatnonzero(of == label)
        rank[members] = (np.arange(len(members)) + 0.5) / len(members)
    return index[np.lexsort((of, rank))]
