"""The benchmark suites (cases per kind) and the targets checked on their results."""

from keras_vit import names

CIFAR_MODEL = dict(image_size=32, patch_size=4, hidden_size=192, num_layers=6, num_heads=3, mlp_dim=768, num_classes=10)
BOTH = ("float32", "mixed_bfloat16")
TIMM_MODES = ("eager", "compile", "eager_bf16", "compile_bf16")
COMPILERS = ("xla", "graph")  # Keras: jit_compile=True (XLA) or False (TensorFlow graph, oneDNN kernels)
INFERENCE_COMPILERS = COMPILERS + ("frozen",)  # and the graph with its weights as constants (export --freeze)
LITERT_MODES = tuple(m for m in names.LITERT_MODES if m != "int16x8")  # the modes timed: all but int16x8
# ONNX Runtime beside LiteRT: the modes both have (int8 weights with dynamic activations; full int8).
ONNX_MODES = tuple(m for m in names.ONNX_MODES if m in names.LITERT_MODES)

# The families after the paper that people fine-tune, at 224 with a 1000-class head (so that
# precisions' top-1 agreement means something), against timm's VisionTransformer of the same
# options (keras-hub's ViT has none of them).
FAMILY_CASES = (
    ("DINOv2-S/14-reg4", dict(preset="dinov2_s14_reg4")),
    ("SigLIP-B/16-224", dict(preset="siglip_b16_224")),
)

# The photo-size pipeline case, also timed with RandAugment.
PIPELINE_224 = dict(
    name="pipeline 224 b32",
    image_size=(224, 224),
    batch=32,
    files=256,
    batches_per_repeat=4,
    trains="Ti/16 training b32",
)

SUITES = {
    # Minutes: small models, every kind of measurement once.
    "quick": {
        # XLA and graph mode: on a TensorFlow CPU `model.predict` runs the latter (for keras_vit in
        # bf16, its frozen graph), elsewhere "graph" is the backend's eager mode
        "inference": [
            dict(
                name="Ti/16 inference b8",
                model="vit_ti16",
                batch=8,
                dtypes=BOTH,
                compilers=COMPILERS,
                timm_modes=("eager",),
            )
        ],
        "training": [
            dict(
                name="CIFAR-size training b128",
                model=CIFAR_MODEL,
                batch=128,
                steps_per_repeat=2,
                dtypes=("float32",),
                timm_modes=("eager",),
            )
        ],
        "litert": [dict(name="CIFAR-size LiteRT b1", model=CIFAR_MODEL, modes=LITERT_MODES)],
        "serving": [
            dict(name="Ti/16 serving b8", model="vit_ti16", batch=8, dtypes=BOTH, timm_modes=("eager", "eager_bf16"))
        ],
        # a shorter run than the default's 130 epochs: the mechanics, not the figure
        "agreement": [dict(name="digits bf16 agreement, 20 epochs", epochs=20, dtypes=("mixed_bfloat16",))],
        "pipeline": [
            dict(
                name="pipeline 32x32 b128",
                image_size=(32, 32),
                batch=128,
                files=64,
                batches_per_repeat=2,
                trains="CIFAR-size training b128",
            )
        ],
    },
    # The figures: about half an hour on 2 cores.
    "full": {
        "inference": [
            dict(
                name=f"{n} inference b32",
                model=p,
                batch=32,
                dtypes=BOTH,
                compilers=INFERENCE_COMPILERS,
                timm_modes=TIMM_MODES,
                agreement_images=256,
            )
            for n, p in (("S/16", "vit_s16"), ("B/16", "vit_b16"))
        ]
        + [
            dict(
                name=f"{n} inference b32",
                model=dict(model, image_size=224, num_classes=1000),
                batch=32,
                dtypes=BOTH,
                compilers=INFERENCE_COMPILERS,
                timm_modes=TIMM_MODES,
                agreement_images=256,
                against=("timm",),
            )
            for n, model in FAMILY_CASES
        ]
        + [
            # bf16 serving latency: one image per call
            dict(
                name="S/16 inference b1",
                model="vit_s16",
                batch=1,
                dtypes=("mixed_bfloat16",),
                compilers=INFERENCE_COMPILERS,
                timm_modes=("eager_bf16", "compile_bf16"),
            )
        ],
        "training": [
            dict(
                name="Ti/16 training b32",
                model="vit_ti16",
                batch=32,
                steps_per_repeat=2,
                dtypes=BOTH,
                compilers=COMPILERS,
                timm_modes=TIMM_MODES,
            ),
            dict(
                name="CIFAR-size training b128",
                model=CIFAR_MODEL,
                batch=128,
                steps_per_repeat=4,
                dtypes=BOTH,
                compilers=COMPILERS,
                timm_modes=TIMM_MODES,
            ),
        ],
        "litert": [dict(name="S/16 LiteRT b1", model="vit_s16", modes=LITERT_MODES, onnx_modes=ONNX_MODES)],
        # the exported files on the server runtimes against timm (benchmark/serving.py)
        "serving": [
            dict(name=f"{n} serving b{b}", model=p, batch=b, dtypes=BOTH, timm_modes=TIMM_MODES)
            for n, p, b in (("S/16", "vit_s16", 32), ("B/16", "vit_b16", 32), ("S/16", "vit_s16", 1))
        ],
        # the agreement bar, on the digits default as `keras-vit train` trains it
        "agreement": [dict(name="digits bf16 agreement", dtypes=("mixed_bfloat16",), compilers=INFERENCE_COMPILERS)],
        "pipeline": [
            PIPELINE_224,
            dict(PIPELINE_224, name="pipeline 224 b32 RandAugment", randaugment=0.5),
            dict(
                name="pipeline 32x32 b128",
                image_size=(32, 32),
                batch=128,
                files=256,
                batches_per_repeat=2,
                trains="CIFAR-size training b128",
            ),
            # A folder at scale: 20,000 photo-size JPEGs with 20 truncated ones.
            dict(
                name="folder 20k 224 b32",
                image_size=(224, 224),
                batch=32,
                files=20_000,
                corrupt=20,
                batches_per_repeat=8,
                trains="Ti/16 training b32",
            ),
        ],
    },
    # A GPU, under KERAS_BACKEND=jax with timm on CUDA (no TensorFlow there, so no keras-hub-on-TF,
    # LiteRT or tf.data cases): the inference cases at batch 256, and ViT-B/16 training at batch 256
    # in bfloat16 against timm with bf16 autocast, eager and torch.compile. Keras models infer
    # through `predict_on_batch` ("xla") and through a jitted `stateless_call` ("stateless").
    "gpu": {
        "inference": [
            dict(
                name=f"{n} inference b256",
                model=p,
                batch=256,
                dtypes=BOTH,
                compilers=("xla", "stateless"),
                timm_modes=TIMM_MODES,
                agreement_images=1024,
            )
            for n, p in (("S/16", "vit_s16"), ("B/16", "vit_b16"))
        ],
        "training": [
            dict(
                name="B/16 training b256",
                model="vit_b16",
                batch=256,
                steps_per_repeat=10,
                dtypes=("mixed_bfloat16",),
                timm_modes=("eager_bf16", "compile_bf16"),
            )
        ],
    },
}
KINDS = ("inference", "training", "agreement", "litert", "serving", "pipeline")
THROUGHPUT_KINDS = ("inference", "training", "serving")  # rows of images/s, timed against timm


def select(suite, kinds=KINDS, cases=None, precisions=BOTH):
    """The cases of `suite` to run, by kind: those of `kinds` whose name contains one of the
    strings `cases` (None: all), with their precisions (Keras dtypes and timm modes; timm's
    "*_bf16" modes are mixed_bfloat16) narrowed to `precisions`. A case left with no Keras
    precision is dropped. Raises ValueError for an unknown precision, a string of `cases` that
    no case's name contains, or a selection with no case."""
    unknown = [p for p in precisions if p not in BOTH]
    if unknown or not precisions:
        raise ValueError(f"unknown precision {unknown[0] if unknown else ''!r}; choose from {', '.join(BOTH)}.")
    offered = {kind: SUITES[suite].get(kind, []) for kind in kinds}
    names = [case["name"] for kind_cases in offered.values() for case in kind_cases]
    for wanted in cases or ():
        if not any(wanted in name for name in names):
            raise ValueError(f"no case of suite {suite!r} has {wanted!r} in its name; its cases: {'; '.join(names)}.")

    def narrowed(case):
        if "dtypes" not in case:  # LiteRT and pipeline cases have no precision to choose
            return case
        timm = tuple(m for m in case.get("timm_modes", ()) if _timm_precision(m) in precisions)
        return {**case, "dtypes": tuple(d for d in case["dtypes"] if d in precisions), "timm_modes": timm}

    selected = {}
    for kind, kind_cases in offered.items():
        chosen = [narrowed(c) for c in kind_cases if cases is None or any(w in c["name"] for w in cases)]
        chosen = [c for c in chosen if c.get("dtypes", True)]
        if chosen:
            selected[kind] = chosen
    if not selected:
        raise ValueError(f"no case of suite {suite!r} is left in {', '.join(precisions)} with these kinds and cases.")
    return selected


def _timm_precision(mode):
    return "mixed_bfloat16" if mode.endswith("_bf16") else "float32"


def mode_label(row):
    """A row's mode with its compiler, e.g. "float32, graph"."""
    return f"{row['mode']}, {row['compiler']}" if row.get("compiler") else row["mode"]


def _rate(rows, case, implementation, mode=None, key="images_per_s", bf16_only=False):
    """Best `key` of `implementation` on `case` in `mode` (timm: its float32 modes, not "*_bf16"),
    or in its best mode (`bf16_only`: of timm's "*_bf16" modes)."""

    def matches(r):
        if bf16_only:
            return r["mode"].endswith("bf16")
        if mode is None:
            return True
        if r["implementation"] == "timm" and mode == "float32":
            return not r["mode"].endswith("bf16")
        return r["mode"] == mode

    rates = [
        r[key]
        for r in rows
        if r["case"] == case and r["implementation"] == implementation and matches(r) and r.get(key) is not None
    ]
    return max(rates) if rates else None


def _against_timm_bf16(check, rows, case):
    """Each keras_vit bfloat16 row of `case` (a suite case; one row per compiler: the path a
    user takes is a row of its own) against timm's best bf16 mode (autocast, eager or
    torch.compile): >= 1.1x, and at batch 1 (latency) >= 1.0x."""
    name = case["name"]
    timm = _rate(rows, name, "timm", key="images_per_s", bf16_only=True)
    for r in rows:
        if r["case"] == name and r["implementation"] == "keras_vit" and r["mode"] == "mixed_bfloat16" and timm:
            bar = 1.0 if case["batch"] == 1 else 1.1
            check(f"{name}: {mode_label(r)} vs timm's best bf16", r["images_per_s"] / timm, bar)


def targets(results, suite, peak_gflops):
    """The issue's fixed targets, as ratios of this run's figures: a list of
    {target, value, bar, met}; targets whose figures were not measured are left out."""
    checks = []

    def check(name, value, bar, at_least=True):
        if value is not None:
            checks.append(
                dict(target=name, value=round(value, 3), bar=bar, met=bool(value >= bar if at_least else value <= bar))
            )

    def ratio(a, b):
        return a / b if a is not None and b else None

    inference, training = results.get("inference", []), results.get("training", [])
    for case in SUITES[suite].get("inference", []):
        name, ours = case["name"], _rate(inference, case["name"], "keras_vit", "float32")
        check(f"{name}: float32 vs keras-hub float32", ratio(ours, _rate(inference, name, "keras-hub", "float32")), 1.1)
        check(f"{name}: float32 vs timm's best float32", ratio(ours, _rate(inference, name, "timm", "float32")), 1.1)
        bf16 = _rate(inference, name, "keras_vit", "mixed_bfloat16")
        check(
            f"{name}: mixed_bfloat16 vs keras-hub float32",
            ratio(bf16, _rate(inference, name, "keras-hub", "float32")),
            1.8,
        )
        _against_timm_bf16(check, inference, case)
        if "B/16" in name:  # against the peak probed in the same rounds (older results: the suite's)
            share = _rate(inference, name, "keras_vit", "float32", key="peak_share")
            if share is None and peak_gflops:
                share = ratio(_rate(inference, name, "keras_vit", "float32", key="gflops_per_s"), peak_gflops)
            check(f"{name}: float32 share of the FP32 FMA peak", share, 0.85)
    for case in SUITES[suite].get("training", []):
        name = case["name"]
        hub = _rate(training, name, "keras-hub", "float32")
        check(f"{name}: float32 vs keras-hub float32", ratio(_rate(training, name, "keras_vit", "float32"), hub), 1.1)
        check(
            f"{name}: mixed_bfloat16 vs keras-hub float32",
            ratio(_rate(training, name, "keras_vit", "mixed_bfloat16"), hub),
            1.6,
        )
        _against_timm_bf16(check, training, case)
        if "Ti/16" in name:
            for r in training:
                if r["case"] == name and r["implementation"] == "keras_vit":
                    mode = mode_label(r)
                    check(f"{name}: first step seconds ({mode})", r["first_step_s"], 10.0, at_least=False)
    for r in results.get("agreement", []):  # a trained model: random weights' near-ties do not count
        check(f"{r['case']}: {mode_label(r)} top-1 agreement with float32", r["agreement_with_float32"], 0.99)
    litert = {r["mode"]: r["latency_ms"] for r in results.get("litert", []) if r["implementation"] == "keras_vit"}
    onnx = {r["mode"]: r["latency_ms"] for r in results.get("litert", []) if r["implementation"] == "onnxruntime"}
    for mode, label in (("int8", "full-int8"), ("int8-mixed", "int8-mixed (float softmax, GELU, normalisation)")):
        if mode in litert and "float32" in litert:
            check(f"LiteRT {label} latency / float32 latency", litert[mode] / litert["float32"], 0.35, at_least=False)
    for mode in (m for m in ONNX_MODES if m in litert and m in onnx):
        check(f"LiteRT {mode} latency / ONNX Runtime {mode} latency", litert[mode] / onnx[mode], 1.0, at_least=False)
    for case in SUITES[suite].get("serving", []):
        _fastest_server_runtime(check, results.get("serving", []), case["name"])
    for case in SUITES[suite].get("pipeline", []):
        pipe = _rate(results.get("pipeline", []), case["name"], "keras_vit")
        for r in results.get("pipeline", []):
            if r["case"] == case["name"] and r.get("first_batch_s") is not None:
                check(f"{case['name']}: seconds to the first batch", r["first_batch_s"], 10.0, at_least=False)
                planted, found = (int(n) for n in r["corrupt"].split(" / "))
                check(f"{case['name']}: corrupt files found / planted", found / planted, 1.0)
        train = [
            r["images_per_s"] for r in training if r["case"] == case["trains"] and r["implementation"] == "keras_vit"
        ]
        check(
            f"{case['name']}: pipeline / fastest keras_vit training rate",
            ratio(pipe, max(train) if train else None),
            3.0,
        )
    return checks


SERVER_RUNTIMES = ("SavedModel", "onnxruntime", "openvino")


def _fastest_server_runtime(check, rows, name):
    """The fastest server runtime's float32 row and bfloat16 row of serving case `name`, each
    against timm's best mode of that precision: >= 1.1x."""
    for ours, theirs, label in (("float32", "float32", "float32"), ("bfloat16", "mixed_bfloat16", "bf16")):
        best = max(
            (r for r in rows if r["case"] == name and r["implementation"] in SERVER_RUNTIMES and r["mode"] == ours),
            key=lambda r: r["images_per_s"],
            default=None,
        )
        timm = _rate(rows, name, "timm", theirs, bf16_only=theirs != "float32")
        if best is not None and timm:
            check(
                f"{name}: fastest server runtime ({best['implementation']}) {label} vs timm's best {label}",
                best["images_per_s"] / timm,
                1.1,
            )
