"""Published checkpoints by name: their public URLs, fetched once into the Keras cache.

The original ViT release (google-research/vision_transformer) and the AugReg release
("How to train your ViT?"). The publishers give no checksums, so the SHA-256 of the first
download is recorded beside the file and every later use is checked against it.
"""

import hashlib
import os
import tempfile
import urllib.request

from keras_vit.checkpoints.files import CheckpointError
from keras_vit.names import cache_home

_ORIGINAL = "https://storage.googleapis.com/vit_models/"
_AUGREG = _ORIGINAL + "augreg/"
_AUGREG_FT = "--imagenet2012-steps_20k-lr_{lr}-res_{res}.npz"

# name -> (preset, config overrides the checkpoint needs, URL)
KNOWN_CHECKPOINTS = {}


def _add(name, preset, url, **overrides):
    KNOWN_CHECKPOINTS[name] = (preset, overrides, url)


for _preset, _model in (
    ("vit_b16", "ViT-B_16"),
    ("vit_b32", "ViT-B_32"),
    ("vit_l16", "ViT-L_16"),
    ("vit_l32", "ViT-L_32"),
    ("vit_h14", "ViT-H_14"),
    ("vit_r50_b16", "R50+ViT-B_16"),
):
    # Original ImageNet-21k pre-training: 21,843 classes with the pre-logits layer.
    _add(
        f"{_preset}.imagenet21k",
        _preset,
        f"{_ORIGINAL}imagenet21k/{_model}.npz",
        num_classes=21843,
        representation_size={"vit_h14": 1280, "vit_l16": 1024, "vit_l32": 1024}.get(_preset, 768),
    )
for _preset, _model in (
    ("vit_b16", "ViT-B_16"),
    ("vit_b32", "ViT-B_32"),
    ("vit_l16", "ViT-L_16"),
    ("vit_l32", "ViT-L_32"),
    ("vit_r50_b16", "R50+ViT-B_16"),
):
    _add(
        f"{_preset}.imagenet21k_ft_imagenet1k_384",
        _preset,
        f"{_ORIGINAL}imagenet21k+imagenet2012/{_model}.npz",
        image_size=384,
    )
for _preset, _model in (("vit_b16", "ViT-B_16"), ("vit_l16", "ViT-L_16")):
    _add(f"{_preset}.imagenet21k_ft_imagenet1k", _preset, f"{_ORIGINAL}imagenet21k+imagenet2012/{_model}-224.npz")
# AugReg: ImageNet-21k pre-training, ImageNet-1k fine-tuning at 224 and 384.
for _preset, _stem, _lr in (
    ("vit_ti16", "Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0", "0.03"),
    ("vit_s16", "S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0", "0.03"),
    ("vit_s32", "S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0", "0.03"),
    ("vit_b16", "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0", "0.01"),
    ("vit_l16", "L_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1", "0.01"),
):
    for _res in (224, 384):
        _suffix = "" if _res == 224 else "_384"
        _add(
            f"{_preset}.augreg_in21k_ft_in1k{_suffix}",
            _preset,
            _AUGREG + _stem + _AUGREG_FT.format(lr=_lr, res=_res),
            image_size=_res,
        )
    _add(f"{_preset}.augreg_in21k", _preset, f"{_AUGREG}{_stem}.npz", num_classes=21843)
_add(
    "vit_b32.augreg_in21k_ft_in1k",
    "vit_b32",
    _AUGREG + "B_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.03-do_0.0-sd_0.0" + _AUGREG_FT.format(lr="0.03", res=224),
)
_add(
    "vit_b8.augreg_in21k_ft_in1k",
    "vit_b8",
    _AUGREG + "B_8-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0" + _AUGREG_FT.format(lr="0.01", res=224),
)

# AugReg hybrids: the release recommends another upstream run for each fine-tuning resolution.
for _preset, _lr, _stem_224, _stem_384 in (
    ("vit_r_ti16", "0.03", "R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0", None),
    (
        "vit_r26_s32",
        "0.03",
        "R26_S_32-i21k-300ep-lr_0.001-aug_light0-wd_0.03-do_0.1-sd_0.1",
        "R26_S_32-i21k-300ep-lr_0.001-aug_medium2-wd_0.03-do_0.0-sd_0.0",
    ),
    (
        "vit_r50_l32",
        "0.01",
        "R50_L_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1",
        "R50_L_32-i21k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0",
    ),
):
    _stem_384 = _stem_384 or _stem_224
    _add(
        f"{_preset}.augreg_in21k_ft_in1k",
        _preset,
        _AUGREG + _stem_224 + _AUGREG_FT.format(lr=_lr, res=224),
    )
    _add(
        f"{_preset}.augreg_in21k_ft_in1k_384",
        _preset,
        _AUGREG + _stem_384 + _AUGREG_FT.format(lr=_lr, res=384),
        image_size=384,
    )
    _add(f"{_preset}.augreg_in21k", _preset, f"{_AUGREG}{_stem_384}.npz", num_classes=21843)


def settings(weights, preset=None):
    """The config fields (resolution, classes, pre-logits) the known checkpoint `weights` was
    trained with; {} for a path. Raises ValueError when it belongs to another preset."""
    if not isinstance(weights, str) or weights not in KNOWN_CHECKPOINTS:
        return {}
    owner, fields, _ = KNOWN_CHECKPOINTS[weights]
    if preset is not None and owner != preset:
        raise ValueError(f"{weights!r} is a checkpoint of preset {owner!r}, not {preset!r}.")
    return dict(fields)


def fetch(name, timeout=30):
    """Local path of known checkpoint `name`, downloading it once (with a progress bar)."""
    url = KNOWN_CHECKPOINTS[name][2]
    target = cache_home() / url.rsplit("/", 1)[-1]
    digest_file = target.with_name(target.name + ".sha256")
    if target.exists() and digest_file.exists():
        if sha256(target) != digest_file.read_text().strip():
            raise CheckpointError(
                f"{target} does not match the checksum of its first download; delete it to fetch again."
            )
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        digest = _download(url, target, timeout)
    except OSError as error:
        raise CheckpointError(
            f"cannot download {name!r} from {url} ({error}). Fetch it where there is internet "
            f"(e.g. `curl -L -o {target.name} '{url}'`) and give that file's path in place of the name "
            f"(e.g. --weights /path/to/{target.name})."
        ) from None
    digest_file.write_text(digest + "\n")
    return target


def _download(url, target, timeout):
    from keras_vit.progress import progress_bar

    with urllib.request.urlopen(url, timeout=timeout) as response:
        total = int(response.headers.get("Content-Length") or 0) or None
        progress = progress_bar(total, unit_name="B")
        digest = hashlib.sha256()
        handle, temporary = tempfile.mkstemp(dir=target.parent, suffix=".part")
        try:
            with os.fdopen(handle, "wb") as out:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    digest.update(chunk)
                    progress.add(len(chunk))
            os.replace(temporary, target)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
    return digest.hexdigest()


def sha256(path):
    """The SHA-256 hex digest of a file, read in 1 MiB pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
