"""tf-keras-vis saliency for ViT: Saliency, SmoothGrad, GradCAM++ and ScoreCAM.

The CAM methods need a spatial feature map. A ViT has none, and tf-keras-vis, left to itself,
goes looking for a `Conv` layer; the right map is `patch_grid`, the input of the last block
as `(batch, rows, cols, D)` (the class token reads these tokens in the last attention).
This helper always names that layer and turns tf-keras-vis's Conv search off. Needs the
TensorFlow backend and `pip install tf-keras-vis`.
"""

import warnings

import keras
import numpy as np

from keras_vit.model import check_images
from keras_vit.names import SALIENCY_METHODS as METHODS
from keras_vit.saving import in_policy

CAM_LAYER = "patch_grid"


def saliency_maps(model, images, method="gradcam++", class_index=None, scorecam_channels=64):
    """Heat maps `(batch, H, W)` in [0, 1] explaining `class_index` (default: the predicted
    class of each image) with a tf-keras-vis method from `METHODS`; a mixed-precision model is
    explained through a float32 copy."""
    if method not in METHODS:
        raise ValueError(f"unknown saliency method {method!r}; choose from {', '.join(METHODS)}.")
    if keras.backend.backend() != "tensorflow":
        raise ValueError(f"tf-keras-vis needs the TensorFlow backend (KERAS_BACKEND={keras.backend.backend()}).")
    try:
        from tf_keras_vis.gradcam_plus_plus import GradcamPlusPlus
        from tf_keras_vis.saliency import Saliency
        from tf_keras_vis.scorecam import Scorecam
        from tf_keras_vis.utils.scores import CategoricalScore
    except ImportError:
        raise ValueError("saliency maps need tf-keras-vis: pip install 'keras3-vit[inspect]'.") from None
    images = np.asarray(images, dtype="float32")
    if hasattr(model, "config"):  # keras_vit's one-line message before tf-keras-vis's
        check_images(images.shape, model.config)
    # tf-keras-vis's CAM arithmetic is float32: a mixed-precision model's bf16/fp16 activations
    # failed in it ("expected a float tensor but is a bfloat16 tensor").
    model = in_policy(model, "float32")
    classes = model.output_shape[-1]
    if class_index is None:
        class_index = np.argmax(model.predict(images, verbose=0), axis=-1)
    indices = np.asarray(class_index)
    if indices.dtype.kind not in "iu" or indices.ndim > 1 or indices.size not in (1, len(images)):
        raise ValueError(
            f"class_index must be a class index or one per image ({len(images)}); got {class_index!r:.80}."
        )
    if not ((0 <= indices) & (indices < classes)).all():
        raise ValueError(
            f"class index {class_index} is out of range: the model has {classes} classes (0 to {classes - 1})."
        )
    score = CategoricalScore(np.broadcast_to(indices, (len(images),)).tolist())
    # tf-keras-vis calls the model on a list of inputs, and Scorecam runs model.predict with
    # Keras's progress bar: neither the structure warning nor the bar is the user's to act on.
    interactive = keras.utils.is_interactive_logging_enabled()
    keras.utils.disable_interactive_logging()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The structure of `inputs` doesn't match")
            if method in ("saliency", "smoothgrad"):
                noise = dict(smooth_samples=20, smooth_noise=0.2) if method == "smoothgrad" else {}
                maps = Saliency(model, clone=False)(score, images, **noise)
            else:
                cam = dict(penultimate_layer=CAM_LAYER, seek_penultimate_conv_layer=False)
                if method == "gradcam++":
                    maps = GradcamPlusPlus(model, clone=False)(score, images, **cam)
                else:
                    # tf-keras-vis refuses more channels than the layer has (a model narrower than 64)
                    channels = min(scorecam_channels, model.get_layer(CAM_LAYER).output.shape[-1])
                    maps = Scorecam(model, clone=False)(score, images, max_N=channels, **cam)
    finally:
        if interactive:
            keras.utils.enable_interactive_logging()
    return np.asarray(maps, dtype="float32").reshape(images.shape[:3])
