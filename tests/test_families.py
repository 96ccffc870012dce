"""The ViT families after the paper (DINOv2 with and without registers, SigLIP's attention-pool
head): keras_vit computes what timm and Transformers compute from their own files.

Reference models are built with random weights from a config (nothing downloaded), every tensor
moved off its initial value, written in their native formats, and compared on real photos in
float32. Headless models are compared on the pooled features the reference returns.
"""

import logging

import keras
import numpy as np
import pytest
from helpers import max_diff, perturb, perturbed_torch, sample_photos, tiny_config

import keras_vit
from keras_vit.benchmark import torchvision_stub

torch = pytest.importorskip("torch")
torchvision_stub.install()  # before timm and transformers: see torchvision_stub.py
timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")
TOLERANCE = 1e-4
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4)


def reference_input(pixels, mean, std):
    """[0, 255] NHWC pixels -> the reference's normalised NCHW input; `mean`, `std` in [0, 1] units."""
    x = (pixels / 255.0 - np.asarray(mean)) / np.asarray(std)
    return torch.from_numpy(x.astype("float32").transpose(0, 3, 1, 2).copy())


# (timm architecture, its options shrunk to 2 blocks of width 192, the fields read off the file)
TIMM_CASES = {
    "dinov2_reg4": (
        "vit_small_patch14_reg4_dinov2",
        dict(img_size=224),
        dict(classifier="token", num_register_tokens=4, no_embed_class=True, layer_scale_init=1e-5),
    ),
    "dinov2_avg_fc_norm": (
        "vit_small_patch14_dinov2",
        dict(img_size=224, global_pool="avg", num_classes=10),
        dict(classifier="gap", class_token=True, fc_norm=True, num_classes=10),
    ),
    "siglip_map": ("vit_base_patch16_siglip_224", dict(num_classes=0), dict(classifier="map", class_token=False)),
    # timm's Eva class: EVA-02 Ti (packed q/k/v with q and v biases, packed SwiGLU), B (separate
    # projections, SwiGLU with its LayerNorm), a 336-pixel EVA-02 (rotary coordinates scaled to the
    # 16x16 grid of 224), DINOv3 (rotary embeddings alone, registers, no q/k/v biases)
    "eva02_ti": (
        "eva02_tiny_patch14_224",
        dict(num_classes=0),
        dict(mlp_type="swiglu", key_bias=False, rope="eva02", fc_norm=True, mlp_norm=False),
    ),
    "eva02_b": ("eva02_base_patch14_224", dict(num_classes=0), dict(mlp_type="swiglu", mlp_norm=True)),
    "eva02_336": (
        "eva02_tiny_patch14_336",
        dict(num_classes=5),
        dict(image_size=(336, 336), rope_reference_grid=(16, 16), num_classes=5),
    ),
    "dinov3": (
        "vit_small_patch16_dinov3",
        dict(num_classes=0),
        dict(rope="dinov3", position_embedding=False, num_register_tokens=4, qkv_bias=False, layer_norm_epsilon=1e-5),
    ),
}


@pytest.mark.parametrize("case", sorted(TIMM_CASES))
def test_timm_files_of_the_new_families(tmp_path, case):
    from safetensors.torch import save_file

    name, options, fields = TIMM_CASES[case]
    reference = perturbed_torch(
        timm.create_model(name, pretrained=False, depth=2, embed_dim=192, num_heads=3, **options)
    )
    size = reference.patch_embed.img_size[0] if "pos_embed" in reference.state_dict() else 224
    pixels = sample_photos(size)
    cfg = reference.pretrained_cfg
    with torch.no_grad():
        expected = reference(reference_input(pixels, cfg["mean"], cfg["std"])).numpy()
    save_file(reference.state_dict(), tmp_path / "model.safetensors")
    statistics = dict(input_mean=tuple(255 * m for m in cfg["mean"]), input_std=tuple(255 * s for s in cfg["std"]))
    model = keras_vit.ViT.from_checkpoint(tmp_path / "model.safetensors", image_size=size, **statistics)
    for field, value in fields.items():
        assert getattr(model.config, field) == value, field
    assert keras_vit.count_params(model) == sum(p.numel() for p in reference.parameters())
    assert max_diff(model, expected, pixels) <= TOLERANCE


# Patch grids of the dynamic-size tests: a square one and a non-square one, both unlike the
# 16x16 (or 14x14) grid the models are built for.
DYNAMIC_GRIDS = ((10, 10), (12, 7))


@pytest.mark.parametrize("case", ["dinov2_reg4", "dinov2_avg_fc_norm", "siglip_map", "eva02_ti", "dinov3"])
def test_timm_dynamic_image_size(tmp_path, case):
    """One model takes each batch at its own size, as timm's `dynamic_img_size=True` does: the
    position embedding resampled with timm's antialiased bicubic, rotary tables of the batch's grid."""
    from safetensors.torch import save_file

    name, options, _ = TIMM_CASES[case]
    reference = perturbed_torch(
        timm.create_model(name, pretrained=False, depth=2, embed_dim=192, num_heads=3, dynamic_img_size=True, **options)
    )
    save_file(reference.state_dict(), tmp_path / "model.safetensors")
    cfg = reference.pretrained_cfg
    statistics = dict(input_mean=tuple(255 * m for m in cfg["mean"]), input_std=tuple(255 * s for s in cfg["std"]))
    model = keras_vit.ViT.from_checkpoint(tmp_path / "model.safetensors", dynamic_image_size=True, **statistics)
    assert model.config.posemb_interpolation == "bicubic_antialias"
    patch = model.config.patch_size[0]
    for grid in DYNAMIC_GRIDS:
        pixels = sample_photos((grid[0] * patch, grid[1] * patch))
        with torch.no_grad():
            expected = reference(reference_input(pixels, cfg["mean"], cfg["std"])).numpy()
        assert max_diff(model, expected, pixels) <= TOLERANCE, grid


def _siglip_config(**extra):
    return dict(vision_config=dict(**SMALL, intermediate_size=128, image_size=224, patch_size=16), **extra)


# name -> (reference model, what the reference returns, fields read off the folder)
HF_CASES = {
    "Dinov2Model": (
        lambda: transformers.Dinov2Model(transformers.Dinov2Config(**SMALL, image_size=224, patch_size=14)),
        lambda model, x: model(pixel_values=x).pooler_output,
        dict(classifier="token", layer_scale_init=1.0),
    ),
    "Dinov2WithRegistersModel": (
        lambda: transformers.Dinov2WithRegistersModel(
            transformers.Dinov2WithRegistersConfig(**SMALL, image_size=224, patch_size=14)
        ),
        lambda model, x: model(pixel_values=x).pooler_output,
        dict(classifier="token", num_register_tokens=4),
    ),
    "Dinov2Model_swiglu": (  # DINOv2-g's MLP: packed SwiGLU `weights_in` / `weights_out`
        lambda: transformers.Dinov2Model(
            transformers.Dinov2Config(**SMALL, image_size=224, patch_size=14, use_swiglu_ffn=True)
        ),
        lambda model, x: model(pixel_values=x).pooler_output,
        dict(mlp_type="swiglu", mlp_dim=176),
    ),
    "DINOv3ViTModel": (  # rotary embeddings alone, registers, no key bias
        lambda: transformers.DINOv3ViTModel(
            transformers.DINOv3ViTConfig(
                **SMALL, intermediate_size=128, image_size=224, patch_size=16, num_register_tokens=4
            )
        ),
        lambda model, x: model(pixel_values=x).pooler_output,
        dict(rope="dinov3", position_embedding=False, num_register_tokens=4, key_bias=False, layer_norm_epsilon=1e-5),
    ),
    "DINOv3ViTModel_gated": (  # the larger models' gated MLP
        lambda: transformers.DINOv3ViTModel(
            transformers.DINOv3ViTConfig(
                **SMALL, intermediate_size=96, image_size=224, patch_size=16, use_gated_mlp=True, hidden_act="silu"
            )
        ),
        lambda model, x: model(pixel_values=x).pooler_output,
        dict(mlp_type="swiglu", mlp_dim=96),
    ),
    "SiglipVisionModel": (
        lambda: transformers.SiglipVisionModel(
            transformers.SiglipVisionConfig(**SMALL, intermediate_size=128, image_size=224, patch_size=16)
        ),
        lambda model, x: model(pixel_values=x).pooler_output,
        dict(classifier="map", gelu_approximate=True, num_classes=0),
    ),
    "SiglipModel": (  # the vision tower of the image-text model; the text tower is left out
        lambda: transformers.SiglipModel(transformers.SiglipConfig(**_siglip_config(text_config=dict(**SMALL)))),
        lambda model, x: model.get_image_features(pixel_values=x).pooler_output,
        dict(classifier="map", num_classes=0),
    ),
    "SiglipForImageClassification": (  # the mean of the tokens; its vision model's head is unused
        lambda: transformers.SiglipForImageClassification(
            transformers.SiglipConfig(**_siglip_config(text_config=dict(**SMALL), num_labels=5))
        ),
        lambda model, x: model(pixel_values=x).logits,
        dict(classifier="gap", num_classes=5),
    ),
}


@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_huggingface_folders_of_the_new_families(tmp_path, case):
    build, run, fields = HF_CASES[case]
    reference = perturbed_torch(build())
    reference.save_pretrained(tmp_path / "hf")
    pixels = sample_photos(224)
    with torch.no_grad():
        expected = run(reference, reference_input(pixels, 0.5, 0.5)).numpy()
    model = keras_vit.ViT.from_checkpoint(tmp_path / "hf")
    for field, value in fields.items():
        assert getattr(model.config, field) == value, field
    assert max_diff(model, expected, pixels) <= TOLERANCE


@pytest.mark.parametrize("case", ["Dinov2WithRegistersModel", "SiglipVisionModel", "DINOv3ViTModel"])
def test_transformers_dynamic_image_size(tmp_path, case):
    """Transformers' models at other sizes (`interpolate_pos_encoding`: torch's bicubic, with
    antialiasing for DINOv2 with registers only) against one keras_vit model of `dynamic_image_size`."""
    build, run, _ = HF_CASES[case]
    reference = perturbed_torch(build())
    reference.save_pretrained(tmp_path / "hf")
    model = keras_vit.ViT.from_checkpoint(tmp_path / "hf", dynamic_image_size=True)
    assert model.config.posemb_interpolation == ("bicubic_antialias" if "Registers" in case else "bicubic")
    patch = model.config.patch_size[0]
    for grid in DYNAMIC_GRIDS:
        pixels = sample_photos((grid[0] * patch, grid[1] * patch))
        x = reference_input(pixels, 0.5, 0.5)
        with torch.no_grad():
            expected = (
                reference(pixel_values=x, interpolate_pos_encoding=True).pooler_output
                if case.startswith("Siglip")
                else run(reference, x)
            ).numpy()
        assert max_diff(model, expected, pixels) <= TOLERANCE, grid


def _big_vision_siglip(state, depth, heads):
    """A timm SigLIP tower's state dict in big_vision's .npz layout (`params/img/`, blocks
    stacked on a leading layer axis as big_vision's `scan` saves them, the `MAPHead_0` head)."""

    def attention(prefix, q, kv_or_qkv, proj, fused_kv):
        weight, bias = kv_or_qkv
        names = ("key", "value") if fused_kv else ("query", "key", "value")
        out = {}
        for name, w, b in zip(names, np.split(weight, len(names)), np.split(bias, len(names))):
            out[f"{prefix}{name}/kernel"] = w.T.reshape(w.shape[1], heads, -1)
            out[f"{prefix}{name}/bias"] = b.reshape(heads, -1)
        if q is not None:
            out[f"{prefix}query/kernel"] = q[0].T.reshape(q[0].shape[1], heads, -1)
            out[f"{prefix}query/bias"] = q[1].reshape(heads, -1)
        out[f"{prefix}out/kernel"] = proj[0].T.reshape(heads, -1, proj[0].shape[0])
        out[f"{prefix}out/bias"] = proj[1]
        return out

    t = {k: v.numpy() for k, v in state.items()}
    out = {
        "embedding/kernel": t["patch_embed.proj.weight"].transpose(2, 3, 1, 0),
        "embedding/bias": t["patch_embed.proj.bias"],
        "pos_embedding": t["pos_embed"],
        "Transformer/encoder_norm/scale": t["norm.weight"],
        "Transformer/encoder_norm/bias": t["norm.bias"],
        "MAPHead_0/probe": t["attn_pool.latent"],
        "MAPHead_0/LayerNorm_0/scale": t["attn_pool.norm.weight"],
        "MAPHead_0/LayerNorm_0/bias": t["attn_pool.norm.bias"],
    }
    pool = [t[f"attn_pool.{n}"] for n in ("q.weight", "q.bias", "kv.weight", "kv.bias", "proj.weight", "proj.bias")]
    out.update(attention("MAPHead_0/MultiHeadDotProductAttention_0/", pool[:2], pool[2:4], pool[4:], True))
    blocks = []
    for i in range(depth):
        b = f"blocks.{i}."
        block = {
            "LayerNorm_0/scale": t[b + "norm1.weight"],
            "LayerNorm_0/bias": t[b + "norm1.bias"],
            "LayerNorm_1/scale": t[b + "norm2.weight"],
            "LayerNorm_1/bias": t[b + "norm2.bias"],
        }
        qkv = (t[b + "attn.qkv.weight"], t[b + "attn.qkv.bias"])
        proj = (t[b + "attn.proj.weight"], t[b + "attn.proj.bias"])
        block.update(attention("MultiHeadDotProductAttention_0/", None, qkv, proj, False))
        blocks.append(block)
    for j in range(2):
        out[f"MAPHead_0/MlpBlock_0/Dense_{j}/kernel"] = t[f"attn_pool.mlp.fc{j + 1}.weight"].T
        out[f"MAPHead_0/MlpBlock_0/Dense_{j}/bias"] = t[f"attn_pool.mlp.fc{j + 1}.bias"]
        for i in range(depth):
            blocks[i][f"MlpBlock_0/Dense_{j}/kernel"] = t[f"blocks.{i}.mlp.fc{j + 1}.weight"].T
            blocks[i][f"MlpBlock_0/Dense_{j}/bias"] = t[f"blocks.{i}.mlp.fc{j + 1}.bias"]
    for name in blocks[0]:
        out[f"Transformer/encoderblock/{name}"] = np.stack([block[name] for block in blocks])
    return {f"params/img/{k}": v for k, v in out.items()}


def test_a_big_vision_siglip_npz_loads_with_its_attention_pool_head(tmp_path):
    """big_vision's SigLIP image tower (.npz, `params/img/`, stacked blocks, `MAPHead_0`), written
    from a timm model and read back by timm's own .npz reader to prove the layout, then loaded by
    keras_vit: the pooled features of the timm model (with big_vision's tanh GELU) within 1e-4."""
    from timm.models.vision_transformer import _load_weights

    def siglip():
        options = dict(depth=2, embed_dim=192, num_heads=3, num_classes=0, act_layer="gelu_tanh")
        return timm.create_model("vit_base_patch16_siglip_224", pretrained=False, **options)

    reference = perturbed_torch(siglip())
    np.savez(tmp_path / "siglip.npz", **_big_vision_siglip(reference.state_dict(), depth=2, heads=3))
    reread = siglip().eval()
    _load_weights(reread, str(tmp_path / "siglip.npz"))
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(reread.state_dict()[name], value, rtol=0, atol=0, msg=name)

    pixels = sample_photos(224)
    with torch.no_grad():
        expected = reference(reference_input(pixels, 0.5, 0.5)).numpy()
    model = keras_vit.ViT.from_checkpoint(tmp_path / "siglip.npz")
    assert (model.config.classifier, model.config.num_classes, model.config.gelu_approximate) == ("map", 0, True)
    assert max_diff(model, expected, pixels) <= TOLERANCE


@pytest.mark.parametrize("name", ["vit_small_patch14_reg4_dinov2", "vit_giant_patch14_dinov2"])
def test_an_official_dinov2_pth_loads_with_imagenet_statistics(tmp_path, name):
    """The official DINOv2 layout (registers with a class position slot; DINOv2-g's fused SwiGLU
    as `w12`/`w3`; blocks in chunks), proved by timm's own conversion of it, loads with the
    pooled features of the timm model and ImageNet's statistics, which DINOv2's transforms use."""
    from timm.models.vision_transformer import checkpoint_filter_fn

    options = dict(depth=2, embed_dim=192, num_heads=3, img_size=224)
    reference = perturbed_torch(timm.create_model(name, pretrained=False, **options))
    state = {}
    for key, value in reference.state_dict().items():
        if "giant" in name:
            key = key.replace(".mlp.fc1.", ".mlp.w12.").replace(".mlp.fc2.", ".mlp.w3.")
            key = key.replace("blocks.1.", "blocks.1.1.").replace("blocks.0.", "blocks.0.0.")  # chunks of one block
        state[key] = value.clone()
    if "reg_token" in state:
        slot = 0.05 * torch.randn(1, 1, state["pos_embed"].shape[-1], generator=torch.Generator().manual_seed(1))
        state["register_tokens"] = state.pop("reg_token")
        state["cls_token"] = state["cls_token"] - slot
        state["pos_embed"] = torch.cat([slot, state["pos_embed"]], dim=1)
    state["mask_token"] = torch.zeros(1, state["cls_token"].shape[-1])
    if "giant" not in name:  # timm reads this layout back as the reference's own weights
        for key, value in checkpoint_filter_fn(dict(state), reference).items():
            torch.testing.assert_close(value, reference.state_dict()[key], atol=1e-7, rtol=0, msg=key)
    torch.save(state, tmp_path / "dinov2.pth")

    pixels = sample_photos(224)
    mean, std = reference.pretrained_cfg["mean"], reference.pretrained_cfg["std"]
    with torch.no_grad():
        expected = reference(reference_input(pixels, mean, std)).numpy()
    model = keras_vit.ViT.from_checkpoint(tmp_path / "dinov2.pth")
    assert np.allclose(model.config.input_mean, np.asarray(mean) * 255) and model.config.classifier == "token"
    assert max_diff(model, expected, pixels) <= TOLERANCE


def test_a_class_slot_loads_into_a_model_without_one_by_folding_it_into_the_class_token(tmp_path, caplog):
    """Transformers stores DINOv2-with-registers with a class slot, timm without (the preset's
    way, `no_embed_class`): either loads into either, computing the same."""
    reference = perturbed_torch(
        transformers.Dinov2WithRegistersModel(
            transformers.Dinov2WithRegistersConfig(**SMALL, image_size=224, patch_size=14)
        )
    )
    reference.save_pretrained(tmp_path / "hf")
    pixels = sample_photos(224)
    with torch.no_grad():
        expected = reference(pixel_values=reference_input(pixels, 0.5, 0.5)).pooler_output.numpy()
    small = dict(hidden_size=64, num_layers=2, num_heads=4, mlp_dim=256, image_size=224)
    model = keras_vit.ViT.from_preset("dinov2_s14_reg4", **small, input_mean=(127.5,) * 3, input_std=(127.5,) * 3)
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        keras_vit.load_weights(model, tmp_path / "hf")
    assert "class-token slot added to the class token" in caplog.text
    assert model.get_layer("position_embedding").embedding.shape == (1, 256, 64)
    assert max_diff(model, expected, pixels) <= TOLERANCE


@pytest.mark.parametrize(
    "overrides",
    [
        dict(classifier="map", num_register_tokens=2),
        dict(classifier="gap", class_token=True, fc_norm=True, num_register_tokens=3, no_embed_class=True),
        dict(
            classifier="gap",
            class_token=True,
            fc_norm=True,
            mlp_type="swiglu",
            mlp_norm=True,
            key_bias=False,
            rope="eva02",
            rope_reference_grid=(2, 2),
        ),
        dict(position_embedding=False, rope="dinov3", num_register_tokens=4, qkv_bias=False),
    ],
    ids=["map_registers", "class_token_registers_fc_norm", "eva02", "dinov3"],
)
def test_new_options_round_trip_through_keras_files_and_resizing(tmp_path, overrides):
    model = perturb(keras_vit.ViT(tiny_config(**overrides)))
    with pytest.raises(keras_vit.CheckpointError, match="has no name for variable .*save this model as a .keras file"):
        keras_vit.save_npz(model, tmp_path / "model.npz")
    x = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    expected = keras.ops.convert_to_numpy(model(x))
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras", safe_mode=True)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(loaded(x)), expected)
    features = model.feature_model(blocks=(0, 1))
    outputs = features(x)
    assert outputs["block_1"].shape == (2, 4, 4, 64)  # registers and the class token left out of the maps
    np.testing.assert_allclose(keras.ops.convert_to_numpy(outputs["pooled"]).shape, (2, 64))
    assert len(model.attention_probabilities(x)) == 2
    from keras_vit import inspect

    maps = inspect.class_token_attention(model, x)  # the readout's attention to the patches alone
    assert maps.shape == (2, 2, 4, 4, 4) and np.isfinite(maps).all()
    assert inspect.rollout_maps(model, x).shape == (2, 32, 32)
    bigger = model.resized(64)
    assert bigger(np.zeros((1, 64, 64, 3), "float32")).shape == (1, 7)


def test_checkpoints_of_parts_keras_vit_lacks_are_named_in_one_line(tmp_path):
    from safetensors.torch import save_file

    qk_norm = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1, qk_norm=True)
    save_file(qk_norm.state_dict(), tmp_path / "qk_norm.safetensors")
    with pytest.raises(keras_vit.CheckpointError, match="query/key normalisation is not supported yet"):
        keras_vit.ViT.from_checkpoint(tmp_path / "qk_norm.safetensors")
    config = transformers.Dinov2Config(**SMALL, image_size=28, patch_size=14, hidden_act="relu")
    transformers.Dinov2Model(config).save_pretrained(tmp_path / "relu")
    with pytest.raises(keras_vit.CheckpointError, match="unsupported hidden_act 'relu'"):
        keras_vit.ViT.from_checkpoint(tmp_path / "relu")
