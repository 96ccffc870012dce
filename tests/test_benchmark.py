"""The benchmark suite: FLOP counts, targets from rows, every kind run on a tiny model, CLI."""

import json
import subprocess
import sys

import keras
import pytest

from keras_vit.benchmark import (
    inference,
    isolated,
    litert,
    machine,
    models,
    pipeline,
    report,
    suite,
    timing,
    torchvision_stub,
    training,
)

torchvision_stub.install()  # before timm: see torchvision_stub.py

TINY = dict(image_size=32, patch_size=8, hidden_size=64, num_layers=2, num_heads=4, mlp_dim=128, num_classes=10)
# The suite's mechanics (narrowing, MFU, the tiny model's rows) run uncompiled under PyTorch:
# torch.compile's CPU build took about a minute per test there;
# test_torch_compiled_inference_and_training_rows_on_a_tiny_model (slow) keeps it.
MECHANICS_COMPILERS = ("graph",) if keras.backend.backend() == "torch" else ("xla",)


def mechanics_case(name, **fields):
    """A TINY case of a test of the suite's mechanics, compiled as MECHANICS_COMPILERS says."""
    return dict(name=name, model=TINY, compilers=MECHANICS_COMPILERS, **fields)


def test_forward_flops_match_published_counts():
    # fvcore/timm report 17.6 GMACs for ViT-B/16 at 224 and 4.6 for ViT-S/16 (2 FLOPs per MAC).
    assert models.forward_flops(models.config_for("vit_b16")) / 2 == pytest.approx(17.56e9, rel=0.01)
    assert models.forward_flops(models.config_for("vit_s16")) / 2 == pytest.approx(4.61e9, rel=0.01)


def test_contenders_are_timed_in_rounds():
    calls = []

    def measure(name, values):
        values = iter(values)
        return lambda: calls.append(name) or next(values)

    rounds = timing.interleaved_rounds([measure("a", [100, 1, 5, 3]), measure("b", [100, 2, 9, 4])], repeats=3)
    assert calls == ["a", "b", "b", "a"] * 2  # one warm-up round, then each once a round, every other reversed
    assert rounds == [[1, 5, 3], [2, 9, 4]]  # the warm-up results are left out
    assert timing.median_and_spread(rounds[1]) == (4, (9 - 2) / 4)


def test_targets_are_ratios_of_the_rows():
    def row(case, implementation, mode, rate, **extra):
        return dict(case=case, implementation=implementation, mode=mode, images_per_s=rate, **extra)

    results = {
        "inference": [
            row("S/16 inference b32", "keras_vit", "float32", 20.0, gflops_per_s=184.0),
            row("S/16 inference b32", "keras_vit", "mixed_bfloat16", 30.0, agreement_with_float32=0.995),
            row("S/16 inference b32", "keras-hub", "float32", 16.0),
            row("S/16 inference b32", "timm", "eager", 10.0),
            row("S/16 inference b32", "timm", "compile", 19.0),
            row("S/16 inference b32", "timm", "compile_bf16", 40.0),
            row("S/16 inference b1", "keras_vit", "mixed_bfloat16", 50.0, compiler="frozen"),
            row("S/16 inference b1", "keras_vit", "mixed_bfloat16", 40.0, compiler="graph"),
            row("S/16 inference b1", "timm", "eager_bf16", 45.0),
            row("S/16 inference b1", "timm", "compile_bf16", 30.0),
        ],
        "training": [
            row("Ti/16 training b32", "keras_vit", "float32", 20.0, first_step_s=12.0, compiler="xla"),
            row("Ti/16 training b32", "keras_vit", "mixed_bfloat16", 28.0, first_step_s=8.0, compiler="graph"),
            row("Ti/16 training b32", "keras-hub", "float32", 17.5),
            row("Ti/16 training b32", "timm", "eager_bf16", 20.0),
            row("Ti/16 training b32", "timm", "eager", 25.0),  # float32: not a bf16 competitor
        ],
        "litert": [
            dict(case="S/16 LiteRT b1", implementation="keras_vit", mode="float32", latency_ms=50.0),
            dict(case="S/16 LiteRT b1", implementation="keras_vit", mode="int8", latency_ms=15.0),
            dict(case="S/16 LiteRT b1", implementation="keras_vit", mode="int8-mixed", latency_ms=20.0),
            dict(case="S/16 LiteRT b1", implementation="onnxruntime", mode="float32", latency_ms=40.0),
            dict(case="S/16 LiteRT b1", implementation="onnxruntime", mode="int8", latency_ms=30.0),
        ],
        "serving": [
            row("B/16 serving b32", "SavedModel", "float32", 4.0),
            row("B/16 serving b32", "openvino", "float32", 5.0),
            row("B/16 serving b32", "onnxruntime", "dynamic", 9.0),  # int8: not a float32 contender
            row("B/16 serving b32", "SavedModel", "bfloat16", 12.0),
            row("B/16 serving b32", "openvino", "bfloat16", 20.0),
            row("B/16 serving b32", "timm", "eager", 3.0),
            row("B/16 serving b32", "timm", "compile", 4.0),
            row("B/16 serving b32", "timm", "compile_bf16", 16.0),
        ],
        "pipeline": [row("pipeline 224 b32", "keras_vit", "tf.data", 100.0)],
        "agreement": [
            dict(
                case="digits bf16 agreement",
                implementation="keras_vit",
                mode="mixed_bfloat16",
                compiler=compiler,
                agreement_with_float32=agreed / 359,
            )
            for compiler, agreed in (("xla", 354), ("frozen", 357))
        ],
    }
    found = {t["target"]: (t["value"], t["met"]) for t in suite.targets(results, "full", peak_gflops=230.0)}
    assert found["S/16 inference b32: float32 vs keras-hub float32"] == (1.25, True)
    assert found["S/16 inference b32: float32 vs timm's best float32"] == (pytest.approx(20 / 19, abs=1e-3), False)
    assert found["S/16 inference b32: mixed_bfloat16 vs keras-hub float32"] == (1.875, True)
    # random weights' agreement is reported, not set against the bar: the trained model's is
    assert not [name for name in found if "S/16" in name and "agreement" in name]
    assert found["digits bf16 agreement: mixed_bfloat16, frozen top-1 agreement with float32"] == (0.994, True)
    assert found["digits bf16 agreement: mixed_bfloat16, xla top-1 agreement with float32"] == (0.986, False)
    # each keras_vit bf16 row against timm's best bf16 mode
    assert found["S/16 inference b32: mixed_bfloat16 vs timm's best bf16"] == (0.75, False)
    # batch 1 is latency: level with timm's best bf16 mode is the bar
    assert found["S/16 inference b1: mixed_bfloat16, frozen vs timm's best bf16"] == (
        pytest.approx(50 / 45, abs=1e-3),
        True,
    )
    assert found["S/16 inference b1: mixed_bfloat16, graph vs timm's best bf16"] == (
        pytest.approx(40 / 45, abs=1e-3),
        False,
    )
    assert [t["bar"] for t in suite.targets(results, "full", 230.0) if "b1:" in t["target"]] == [1.0, 1.0]
    assert found["Ti/16 training b32: mixed_bfloat16, graph vs timm's best bf16"] == (1.4, True)
    assert "Ti/16 training b32: float32, xla vs timm's best bf16" not in found
    assert found["Ti/16 training b32: mixed_bfloat16 vs keras-hub float32"] == (1.6, True)
    assert found["Ti/16 training b32: first step seconds (float32, xla)"] == (12.0, False)
    assert found["Ti/16 training b32: first step seconds (mixed_bfloat16, graph)"] == (8.0, True)
    assert found["LiteRT full-int8 latency / float32 latency"] == (0.3, True)
    assert found["LiteRT int8-mixed (float softmax, GELU, normalisation) latency / float32 latency"] == (0.4, False)
    assert found["LiteRT float32 latency / ONNX Runtime float32 latency"] == (1.25, False)  # slower: missed
    assert found["LiteRT int8 latency / ONNX Runtime int8 latency"] == (0.5, True)
    assert found["pipeline 224 b32: pipeline / fastest keras_vit training rate"] == (
        pytest.approx(100 / 28, abs=1e-3),
        True,
    )
    # the fastest server runtime of each precision against timm's best mode of that precision
    assert found["B/16 serving b32: fastest server runtime (openvino) float32 vs timm's best float32"] == (1.25, True)
    assert found["B/16 serving b32: fastest server runtime (openvino) bf16 vs timm's best bf16"] == (1.25, True)
    # B/16 inference and the CIFAR-size model were not measured: their targets are left out, not failed
    assert not [name for name in found if "B/16 inference" in name or "CIFAR" in name]
    assert not [name for name in found if "S/16 serving" in name]


def test_peak_share_pairs_each_round_with_the_peak_probed_in_it():
    # The probe runs in every round; a row's share is the median of its per-round ratios, so a
    # round that load slowed on both sides still counts at the machine's true share.
    rates, peaks = iter([5.0, 10.0, 20.0, 30.0, 40.0, 50.0]), iter([999.0, 100.0, 50.0, 300.0, 400.0, 100.0])
    logged = []
    (row,) = timing.throughput_rows(
        [dict(case="c")],
        [lambda: next(rates)],
        5,
        gflop_per_item=2.0,
        log=logged.append,
        peak_probe=lambda: next(peaks),
    )
    assert logged == [row] and (row["images_per_s"], row["gflops_per_s"], row["fp32_peak_gflops"]) == (
        30.0,
        60.0,
        100.0,
    )
    # shares 0.2, 0.8, 0.2, 0.2, 1.0 (the warm-up round left out): median 0.2, not 60 / 100
    assert row["peak_share"] == pytest.approx(0.2) and row["spread"] == pytest.approx(40 / 30)
    (row,) = timing.throughput_rows([{}], [lambda: 1.0], 5, gflop_per_item=2.0, log=lambda row: None)
    assert "peak_share" not in row and "fp32_peak_gflops" not in row  # no probe (a GPU run)


def test_b16_peak_share_target_prefers_the_in_round_share():
    def b16(**extra):
        return {
            "inference": [
                dict(
                    case="B/16 inference b32",
                    implementation="keras_vit",
                    mode="float32",
                    images_per_s=5.0,
                    gflops_per_s=180.0,
                    **extra,
                )
            ]
        }

    def share(results, peak):
        return {t["target"]: t["value"] for t in suite.targets(results, "full", peak)}.get(
            "B/16 inference b32: float32 share of the FP32 FMA peak"
        )

    assert share(b16(peak_share=0.9), peak=240.0) == 0.9  # measured beside the rows
    assert share(b16(), peak=240.0) == 0.75  # a result from before the probe ran in rounds
    assert share(b16(), peak=None) is None  # no peak at all (no C compiler, or a GPU run)


def test_cases_and_precisions_narrow_a_suite():
    picked = suite.select("full", suite.KINDS, cases=["B/16 inference"], precisions=["float32"])
    assert list(picked) == ["inference"]
    (case,) = picked["inference"]
    assert case["name"] == "B/16 inference b32" and case["dtypes"] == ("float32",)
    assert case["timm_modes"] == ("eager", "compile") and case["compilers"] == suite.INFERENCE_COMPILERS
    assert suite.SUITES["full"]["inference"][1]["dtypes"] == suite.BOTH  # the table itself is left as it was
    # the quick suite's training case runs float32 only: in bfloat16 alone it is dropped, the
    # LiteRT and pipeline cases (no precision to choose) stay, and so does the bf16 agreement,
    # which float32 alone drops
    picked = suite.select("quick", suite.KINDS, precisions=["mixed_bfloat16"])
    assert sorted(picked) == ["agreement", "inference", "litert", "pipeline", "serving"]
    assert "agreement" not in suite.select("quick", suite.KINDS, precisions=["float32"])
    assert picked["inference"][0]["dtypes"] == ("mixed_bfloat16",) and picked["inference"][0]["timm_modes"] == ()
    picked = suite.select("full", ("training", "pipeline"), cases=["CIFAR", "Ti/16"])
    assert [c["name"] for c in picked["training"]] == ["Ti/16 training b32", "CIFAR-size training b128"]
    assert "pipeline" not in picked  # "pipeline 32x32 b128" names neither
    with pytest.raises(ValueError, match="no case of suite 'full' has 'L/16' in its name; its cases: S/16 inference"):
        suite.select("full", ("inference",), cases=["S/16", "L/16"])
    with pytest.raises(ValueError, match="no case of suite 'quick' is left in mixed_bfloat16"):
        suite.select("quick", ("training",), precisions=["mixed_bfloat16"])


def test_a_narrowed_run_says_what_it_ran(monkeypatch):
    from keras_vit.benchmark import runner

    monkeypatch.setitem(
        suite.SUITES,
        "tiny-cpu",
        {
            "inference": [
                mechanics_case("tiny a", batch=2, dtypes=suite.BOTH, timm_modes=("eager", "eager_bf16")),
                dict(name="tiny b", model=TINY, batch=2, dtypes=suite.BOTH),
            ],
            "training": [mechanics_case("tiny a fit", batch=4, steps_per_repeat=1, dtypes=("float32",), timm_modes=())],
        },
    )
    monkeypatch.setattr(machine, "torch_cpu_matmul_gflops", lambda: pytest.fail("no bf16 mode asked for"))
    monkeypatch.setattr(machine.accelerator, "describe", lambda backend: None)  # the CPU path, also on a GPU machine
    built = []  # the probe is compiled once, for the machine record and the rounds alike
    monkeypatch.setattr(machine, "fma_probe", lambda threads, seconds=0.5: built.append(threads) or (lambda: 1000.0))
    result = runner.run_suite(
        "tiny-cpu",
        against=("timm",),
        kinds=suite.KINDS,
        repeats=5,
        log=lambda row: None,
        cases=["a"],
        precisions=["float32"],
    )
    rows = result["results"]["inference"]
    assert [(r["case"], r["implementation"], r["mode"]) for r in rows] == [
        ("tiny a", "keras_vit", "float32"),
        ("tiny a", "timm", "eager"),
    ]
    # on the CPU the FMA probe runs in the rounds beside every contender, in training too
    rows += result["results"]["training"]
    assert [r["fp32_peak_gflops"] for r in rows] == [1000.0] * 3 and all(r["peak_share"] > 0 for r in rows)
    assert built == [2] and result["machine"]["fp32_fma_peak_gflops"] == 1000.0
    assert list(result["results"]) == ["inference", "training"] and result["precisions"] == ["float32"]
    text = report.markdown(result)
    assert "\nSelected cases: names containing 'a'; precisions: float32.\n" in text
    assert "| GFLOP/s | FMA peak GFLOP/s | share of peak | first call s |" in text
    assert "| GFLOP/s | FMA peak GFLOP/s | share of peak | first step s |" in text


def test_inference_and_training_rows_on_a_tiny_model():
    logged = []
    case = mechanics_case(
        "tiny",
        batch=4,
        dtypes=("float32", "mixed_bfloat16"),
        timm_modes=("eager",),
        agreement_images=12,
    )
    against = ("keras-hub", "timm") if keras.backend.backend() == "tensorflow" else ("timm",)
    rows = inference.run_case(case, against, repeats=5, log=logged.append)
    assert [(r["implementation"], r["mode"]) for r in rows] == (
        [("keras_vit", "float32"), ("keras_vit", "mixed_bfloat16")]
        + ([("keras-hub", "float32"), ("keras-hub", "mixed_bfloat16")] if "keras-hub" in against else [])
        + [("timm", "eager")]
    )
    assert logged == rows and all(r["images_per_s"] > 0 and r["gflops_per_s"] > 0 and r["spread"] >= 0 for r in rows)
    assert 0.9 <= rows[1]["agreement_with_float32"] <= 1.0  # same weights, random head: bf16 mostly agrees
    assert rows[1]["agreement_images"] == 12 and "agreement_images" not in rows[0]
    # a flip needs a float32 top-2 gap under twice the largest logit error
    assert 0 < rows[1]["max_logit_error"] < 0.5 and rows[1]["agreement_with_float32"] >= 1 - rows[1]["near_ties"]
    again = inference.run_case(case, (), repeats=5, log=lambda row: None)  # seeded: the same weights
    expected = rows[1]["max_logit_error"]
    if keras.backend.backend() == "torch":  # its first run in a process differs in the 6th digit
        expected = pytest.approx(expected, rel=1e-4)  # (5.03229e-3, then 5.03224e-3); new weights: far more
    assert again[1]["max_logit_error"] == expected
    _training_rows(("xla", "graph") if keras.backend.backend() != "torch" else ("graph",))


@pytest.mark.slow
@pytest.mark.skipif(keras.backend.backend() != "torch", reason="the torch.compile rows")
def test_torch_compiled_inference_and_training_rows_on_a_tiny_model():
    # "xla" under PyTorch is torch.compile, whose CPU build takes about a minute here
    case = dict(name="tiny", model=TINY, batch=4, dtypes=("float32",), compilers=("xla",))
    (row,) = inference.run_case(case, (), repeats=5, log=lambda row: None)
    assert row["compiler"] == "xla" and row["images_per_s"] > 0 and row["first_call_s"] > 0
    _training_rows(("xla",))


def _training_rows(compilers):
    case = dict(
        name="tiny",
        model=TINY,
        batch=8,
        steps_per_repeat=1,
        dtypes=("float32",),
        compilers=compilers,
        timm_modes=("eager",),
    )
    rows = training.run_case(case, ("timm",), repeats=5, log=lambda row: None)
    assert [(r["implementation"], r.get("compiler")) for r in rows] == [
        *(("keras_vit", compiler) for compiler in compilers),
        ("timm", None),
    ]
    assert all(r["images_per_s"] > 0 and r["first_step_s"] > 0 and r["spread"] >= 0 for r in rows)
    fused = "FusedAdamW" if keras.backend.backend() == "tensorflow" else "AdamW"  # keras_vit.training's on TF
    assert [r["optimizer"] for r in rows] == [fused] * len(compilers) + ["torch AdamW"]


def test_a_case_runs_in_a_fresh_process_with_the_same_rows():
    """`full` runs each case in a child process (what a case leaves allocated in TensorFlow does
    not add up over the suite): its rows and logged lines come back as the in-process run's."""
    case = mechanics_case("tiny", batch=4, dtypes=("float32",), timm_modes=())
    logged = []
    rows = isolated.run_case("inference", case, (), 5, 2, logged.append)
    assert logged == rows and [(r["case"], r["implementation"], r["mode"]) for r in rows] == [
        ("tiny", "keras_vit", "float32")
    ]
    assert rows[0]["images_per_s"] > 0 and rows[0]["spread"] >= 0 and "peak_share" not in rows[0]
    with pytest.raises(isolated.CaseFailed, match="process of the case 'broken' failed with exit 1"):
        isolated.run_case("inference", dict(case, name="broken", model="no_such_preset"), (), 5, 2, logged.append)


def test_a_failed_case_process_leaves_the_other_cases(monkeypatch, tmp_path, capsys):
    """`full` on the CPU: a case whose process fails (killed for memory) is a note and the exit
    status; the other cases run and their rows are written. The Keras rows' kernel profiles
    start after their case's process has ended."""
    from keras_vit.benchmark import runner
    from keras_vit_cli import main

    cases = [mechanics_case(name, batch=2, dtypes=("float32",)) for name in ("tiny a", "tiny broken", "tiny c")]
    monkeypatch.setitem(suite.SUITES, "full", {"inference": cases})
    monkeypatch.setattr(machine.accelerator, "describe", lambda backend: None)  # the CPU path, also on a GPU machine
    monkeypatch.setattr(machine, "fma_probe", lambda threads, seconds=0.5: lambda: 1000.0)
    events = []

    def case_process(kind, case, against, repeats, threads, log, peak, kernels, quiet):
        events.append(("case", case["name"], kernels, quiet))
        if case["name"] == "tiny broken":
            raise isolated.CaseFailed("the process of the case 'tiny broken' failed with exit -9 (out of memory?).")
        return [dict(case=case["name"], implementation="keras_vit", mode="float32", compiler="graph", images_per_s=5.0)]

    class Profiler:
        def __init__(self, kind, threads):
            pass

        def keras_rows(self, case, rows):
            events.append(("profile", case["name"]))
            for row in rows:
                row["kernels"] = dict(error="not profiled in this test")

    monkeypatch.setattr(isolated, "run_case", case_process)
    monkeypatch.setattr(runner, "Profiler", Profiler)
    out = tmp_path / "r.json"
    argv = ["benchmark", "--suite", "full", "--kinds", "inference", "--against", "none", "--kernels", "--verbose"]
    assert main(argv + ["--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"keras-vit benchmark: error: not measured: 'tiny broken' (see the notes in {out})"
    assert events == [
        ("case", "tiny a", True, False),  # --verbose keeps the retracing warnings in the case's process
        ("profile", "tiny a"),
        ("case", "tiny broken", True, False),
        ("case", "tiny c", True, False),
        ("profile", "tiny c"),
    ]
    result = json.loads(out.read_text())
    assert [r["case"] for r in result["results"]["inference"]] == ["tiny a", "tiny c"]
    assert [f["case"] for f in result["failed"]] == ["tiny broken"] and "exit -9" in result["failed"][0]["error"]
    assert result["notes"][-1] == f"not measured: {result['failed'][0]['error']}"
    assert "not measured: the process of the case 'tiny broken'" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize(
    "base, mode, backend",
    [("graph", "frozen", "TensorFlow"), ("xla", "stateless", "JAX")],
)
def test_serving_mode_rows_compute_what_keras_computes(base, mode, backend):
    # frozen: the graph with constant weights (TensorFlow); stateless: jax.jit of stateless_call
    case = dict(
        name="tiny",
        model=TINY,
        batch=4,
        dtypes=("float32", "mixed_bfloat16"),
        compilers=(base, mode),
        timm_modes=(),
        agreement_images=12,
    )
    if keras.backend.backend() != backend.lower():
        model = models.build_keras_vit(models.config_for(TINY))
        with pytest.raises(ValueError, match=f"needs the {backend} backend"):
            inference.keras_forward(model, mode, keras.ops.zeros((4, 32, 32, 3)))
        return
    pytest.importorskip("keras_hub")  # a pinned dependency; absent on the GPU machine, which gets wheels by hand
    rows = inference.run_case(case, ("keras-hub",), repeats=5, log=lambda row: None)
    assert [(r["implementation"], r["mode"], r["compiler"]) for r in rows] == [
        (i, d, c) for i in ("keras_vit", "keras-hub") for d in case["dtypes"] for c in case["compilers"]
    ]
    assert all(r["images_per_s"] > 0 for r in rows)
    keras_mode, served = rows[2], rows[3]  # keras_vit bf16 against the float32 `base` logits
    assert keras_mode["max_logit_error"] > 0 and served["max_logit_error"] == keras_mode["max_logit_error"]
    assert served["agreement_with_float32"] == keras_mode["agreement_with_float32"]


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="the no-TensorFlow path of the GPU machine (JAX)")
def test_training_rows_without_tensorflow(monkeypatch):
    # As on the GPU machine, where TensorFlow is not installed: a generator of on-device batches
    # and Keras's own `fit` (keras-hub's maps its preprocessor with tf.data or grain).
    pytest.importorskip("keras_hub")  # a pinned dependency; absent on the GPU machine, which gets wheels by hand
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    case = dict(name="tiny", model=TINY, batch=4, steps_per_repeat=1, dtypes=("mixed_bfloat16",), timm_modes=())
    rows = training.run_case(case, ("keras-hub",), repeats=5, log=lambda row: None)
    assert [(r["implementation"], r["optimizer"]) for r in rows] == [("keras_vit", "AdamW"), ("keras-hub", "AdamW")]
    assert all(r["images_per_s"] > 0 and r["first_step_s"] > 0 for r in rows)


@pytest.mark.tensorflow_only
def test_litert_and_pipeline_rows():
    case = dict(name="tiny", model=TINY, modes=("float32", "int8", "int8-mixed"), onnx_modes=("int8",))
    rows = litert.run_case(case, (), 5, lambda row: None)
    assert [(r["implementation"], r["mode"]) for r in rows] == [
        ("keras_vit", "float32"),
        ("keras_vit", "int8"),
        ("keras_vit", "int8-mixed"),
        ("onnxruntime", "int8"),  # ONNX Runtime's int8 file beside LiteRT's, timed in the same rounds
    ]
    assert rows[3]["latency_ms"] > 0 and rows[3]["size_kb"] > 0
    assert rows[1]["size_kb"] < 0.5 * rows[0]["size_kb"] and all(r["latency_ms"] > 0 for r in rows)
    # int8 softmax and GELU have no XNNPACK kernel; the attention matmuls do (symmetric operands).
    assert "SOFTMAX x" in rows[1]["undelegated_ops"] and "BATCH_MATMUL" not in rows[1]["undelegated_ops"]
    # int8-mixed computes those and the rest of the normalisations in float32, which XNNPACK runs.
    left = {op.split(" x")[0] for op in rows[2]["undelegated_ops"].split(", ")}
    assert not {"SOFTMAX", "GELU", "RSQRT", "ADD", "MEAN", "BATCH_MATMUL"} & left, left
    case = dict(name="pipe", image_size=(32, 32), batch=8, files=16, batches_per_repeat=1, trains="tiny")
    (row,) = pipeline.run_case(case, (), 5, lambda row: None)
    assert row["images_per_s"] > 0


@pytest.mark.tensorflow_only
def test_server_runtime_rows_of_the_exported_files():
    # The SavedModel, ONNX and OpenVINO files as `keras-vit export` writes them, timed in the same
    # rounds as timm; each runtime's own profile of one call (a SavedModel row's comes after the case)
    from keras_vit.benchmark import kernels, serving

    case = dict(name="tiny", model=TINY, batch=4, dtypes=suite.BOTH, timm_modes=("eager",))
    notes = []
    profiler = kernels.Profiler("serving", 2)
    rows = serving.run_case(case, ("timm",), 5, lambda item: notes.append(item), profile=profiler)
    found = [(r["implementation"], r["mode"]) for r in rows]
    from keras_vit.export import openvino_model

    bf16 = [("openvino", "bfloat16")] if "bfloat16" in openvino_model.cpu_modes() else []
    assert found == [
        ("SavedModel", "float32"),
        ("SavedModel", "bfloat16"),
        ("onnxruntime", "float32"),
        ("onnxruntime", "dynamic"),
        ("openvino", "float32"),
        *bf16,
        ("timm", "eager"),
    ], notes
    assert all(r["images_per_s"] > 0 for r in rows)
    # a float32 file computes the Keras model's classes; the reduced precisions stay close
    assert all(r["agreement_with_float32"] == 1.0 for r in rows if r["mode"] == "float32")
    assert all(r["agreement_with_float32"] >= 0.5 for r in rows if r["implementation"] != "timm")
    for row in rows:
        if row["implementation"] in ("onnxruntime", "openvino"):
            ops = {k["primitive"] for k in row["kernels"]["kernels"]}
            matmuls = {"MatMul", "Gemm", "FusedMatMul", "DynamicQuantizeMatMul", "MatMulInteger", "FullyConnected"}
            assert ops & matmuls and row["kernels"]["profiled_ms"] > 0, (row["implementation"], ops)
    saved_model = rows[0]
    profiler.keras_rows(case, [saved_model, rows[2]])  # the ONNX row keeps its own profile
    assert saved_model["kernels"]["onednn_ms"] > 0, saved_model["kernels"]
    assert rows[2]["kernels"]["source"] == "ONNX Runtime's profiler"


def test_jpeg_folder_is_readable_by_the_training_loader(tmp_path):
    from PIL import Image

    pipeline.write_jpeg_folder(tmp_path, 6, size=(40, 50), classes=3)
    files = sorted(tmp_path.rglob("*.jpg"))
    assert len(files) == 6 and sorted({f.parent.name for f in files}) == ["class_0", "class_1", "class_2"]
    assert Image.open(files[0]).size == (50, 40)


def test_fma_peak_is_measured_when_a_compiler_is_there():
    peak = machine.fma_peak_gflops(1, seconds=0.1)
    if peak is None:
        pytest.skip("no C compiler or no AVX2/AVX-512 here")
    assert 1.0 < peak < 1000.0  # one core: a few to a few hundred GFLOP/s
    probe = machine.fma_probe(1, seconds=0.1)  # compiled once, then run as often as asked
    readings = [probe() for _ in range(3)]
    assert all(0.25 * peak < r < 4.0 * peak for r in readings)  # the same kernel; load moves it some


@pytest.mark.parametrize(
    "cpuinfo, name, flags",
    [
        (
            "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n"
            "flags\t\t: fpu avx2 fma\n\nprocessor\t: 1\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: Other\n"
            "flags\t\t: avx512f\n",
            "AMD EPYC, family 25 model 1",
            {"fpu", "avx2", "fma"},
        ),
        (
            "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd bf16\nCPU implementer\t: 0x41\n\n",
            "aarch64",
            {"fp", "asimd", "bf16"},
        ),
    ],
    ids=["x86", "arm"],
)
def test_the_machine_record_names_the_cpu_generation(cpuinfo, name, flags, monkeypatch):
    # "AMD EPYC" alone covers Zen 3, 4 and 5, whose results differ; the first processor speaks.
    from pathlib import Path

    from keras_vit import cpu

    real_read = Path.read_text
    monkeypatch.setattr(
        Path, "read_text", lambda self, *a, **k: cpuinfo if str(self) == "/proc/cpuinfo" else real_read(self, *a, **k)
    )
    monkeypatch.setattr(cpu.platform, "processor", lambda: "")
    monkeypatch.setattr(cpu.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(machine, "fma_peak_gflops", lambda threads, probe=None: None)
    assert (cpu.cpu_name(), cpu.cpu_flags()) == (name, flags)
    assert machine.describe(threads=1)["cpu"] == name


def _result(suite="quick", isa=("avx2",), **fields):
    """A suite result as `keras-vit benchmark` writes it, on a made-up 2-thread CPU."""
    machine = dict(cpu="X", threads=2, cores_visible=2, isa=list(isa), fp32_fma_peak_gflops=100.0)
    header = dict(suite=suite, backend="tensorflow", date="2026-11-26", repeats=5, versions={"keras": "3"})
    return dict(header, machine=machine, **fields)


def test_markdown_lists_rows_and_targets():
    result = _result(
        results={"litert": [dict(case="c", implementation="keras_vit", mode="int8", latency_ms=1.5, size_kb=10.0)]},
        targets=[dict(target="t", value=0.5, bar=0.35, met=False)],
    )
    text = report.markdown(result)
    assert "| c | keras_vit | int8 | 1.5 | 10 |" in text and "| t | 0.500 | 0.35 | NO |" in text
    assert "spread" not in text  # results written before rows had one
    result["results"]["litert"][0]["spread"] = 0.123
    assert "| latency ms | spread | size kB |" in report.markdown(result)
    assert "| c | keras_vit | int8 | 1.5 | 12% | 10 |" in report.markdown(result)
    assert "FP32 FMA peak 100 GFLOP/s" in text
    assert "GPU:" not in text and "MFU" not in text  # no GPU: no MFU column


def test_gpu_rows_get_model_flops_utilisation(monkeypatch):
    # A GPU run (faked): MFU against the GPU's matmul rate, the GPU in the Markdown, and no
    # CPU-peak target for figures that came from the GPU.
    from keras_vit.benchmark import accelerator, runner

    monkeypatch.setitem(
        suite.SUITES,
        "tiny-gpu",
        {
            "inference": [mechanics_case("B/16-like tiny", batch=4, dtypes=("float32",), timm_modes=())],
            "training": [
                mechanics_case("tiny training", batch=4, steps_per_repeat=1, dtypes=("float32",), timm_modes=())
            ],
        },
    )
    gpu = dict(name="Fake GPU", bf16_matmul_tflops=0.5, datasheet_bf16_tflops=2.0)
    monkeypatch.setattr(accelerator, "describe", lambda backend: gpu)
    result = runner.run_suite(
        "tiny-gpu", against=(), kinds=("inference", "training"), repeats=5, log=lambda row: None, kernels=True
    )
    rows = result["results"]["inference"] + result["results"]["training"]
    assert "are of CPU rows" in result["notes"][0] and not [r for r in rows if "kernels" in r]  # oneDNN: CPU only
    assert [r["mfu"] for r in rows] == [pytest.approx(r["gflops_per_s"] / 500.0) for r in rows]
    assert [r["mfu_datasheet"] for r in rows] == [pytest.approx(r["gflops_per_s"] / 2000.0) for r in rows]
    assert not [t for t in result["targets"] if "FMA peak" in t["target"]]
    text = report.markdown(result)
    assert "GPU: Fake GPU, measured bf16 matmul 0 TFLOP/s" in text and "| MFU | MFU of datasheet |" in text
    assert "datasheet dense bf16 2 TFLOP/s" in text


def test_datasheet_peaks_by_gpu_name():
    from keras_vit.benchmark.accelerator import datasheet_bf16_tflops

    assert datasheet_bf16_tflops("NVIDIA H200") == datasheet_bf16_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert datasheet_bf16_tflops("NVIDIA H200 NVL") == 835.0 and datasheet_bf16_tflops("NVIDIA H100 PCIe") == 756.0
    assert datasheet_bf16_tflops("Tesla T4") is None  # not listed: no datasheet MFU, not a guess


@pytest.mark.backend_independent  # timm's modes, chosen from torch's measured rates
@pytest.mark.parametrize("bf16_gflops, kept", [(1.2, ["eager"]), (90.0, ["eager", "eager_bf16"])])
def test_timm_bf16_modes_left_out_where_torch_emulates_bf16(bf16_gflops, kept, monkeypatch):
    from keras_vit.benchmark import runner

    monkeypatch.setitem(
        suite.SUITES,
        "tiny-cpu",
        {"inference": [mechanics_case("tiny", batch=2, dtypes=("float32",), timm_modes=("eager", "eager_bf16"))]},
    )
    monkeypatch.setattr(machine, "torch_cpu_matmul_gflops", lambda: {"float32": 130.0, "bfloat16": bf16_gflops})
    logged = []
    result = runner.run_suite("tiny-cpu", against=("timm",), kinds=("inference",), repeats=5, log=logged.append)
    assert [r["mode"] for r in result["results"]["inference"] if r["implementation"] == "timm"] == kept
    notes = result["notes"]
    assert len(notes) == 2 - len(kept)
    for note in notes:
        assert "1.2 GFLOP/s on this CPU against 130 GFLOP/s" in note and note in logged
        assert f"\n{note}\n" in report.markdown(result)


def test_torch_cpu_matmul_rates_are_measured():
    import torch

    rates = machine.torch_cpu_matmul_gflops(size=64, repeats=2)
    if torch.cuda.is_available():  # timm's bf16 modes then run on the GPU: no CPU rate is asked for
        assert rates is None
    else:
        assert set(rates) == {"float32", "bfloat16"} and min(rates.values()) > 0


def test_gpu_suite_holds_the_issue_case():
    (training_case,) = suite.SUITES["gpu"]["training"]
    assert training_case["model"] == "vit_b16" and training_case["batch"] == 256
    assert "compile_bf16" in training_case["timm_modes"] and "litert" not in suite.SUITES["gpu"]


@pytest.mark.tensorflow_only
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--kinds", "inference,speed"], "unknown kind 'speed'"),
        (["--against", "pytorch"], "unknown implementation 'pytorch'"),
        (["--repeats", "3"], "repeats must be at least 5"),
        (["--cases", "Z/99"], "no case of suite 'quick' has 'Z/99' in its name"),
        (["--precisions", "float32,float16"], "unknown precision 'float16'"),
        # Empty lists ran the whole default suite; none among others was an "unknown implementation".
        (["--against", ""], "--against names nothing; give one or more of keras-hub, timm, or none"),
        (["--kinds", " , "], "--kinds names nothing; give one or more of inference, training"),
        (["--precisions", ""], "--precisions names nothing"),
        (["--against", "none,timm"], "--against none compares with nothing; it goes alone"),
        (["--against", "timm,torch"], "unknown implementation 'torch' in --against; choose from keras-hub, timm, or"),
        (["--suite", "gpu"], "the gpu suite (batch 256, B/16 training) is for a GPU, under KERAS_BACKEND=jax"),
    ],
)
def test_benchmark_bad_input(argv, message, tmp_path, capsys):
    from keras_vit_cli import main

    assert main(["benchmark", "--out", str(tmp_path / "r.json"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "r.json").exists()


@pytest.mark.tensorflow_only
def test_benchmark_output_checked_before_timing(tmp_path, capsys, monkeypatch):
    from keras_vit.benchmark import machine
    from keras_vit_cli import main

    def no_timing(threads):
        raise AssertionError("the suite started before its output was checked")

    monkeypatch.setattr(machine, "fma_probe", no_timing)
    (tmp_path / "file").write_text("a file, not a folder")
    for out, message in (
        (tmp_path, "is a folder; give the results file"),
        (tmp_path / "file" / "r.json", f"cannot write the results to {tmp_path / 'file' / 'r.json'}: "),
    ):
        assert main(["benchmark", "--kinds", "pipeline", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    # a new folder is made for the results
    with pytest.raises(AssertionError, match="before its output was checked"):
        main(["benchmark", "--kinds", "pipeline", "--out", str(tmp_path / "new" / "r.json")])
    assert (tmp_path / "new").is_dir() and not list((tmp_path / "new").iterdir())


@pytest.mark.slow
@pytest.mark.tensorflow_only
def test_quick_suite_end_to_end(tmp_path, capsys):
    from keras_vit_cli import main

    out = tmp_path / "results.json"
    assert main(["benchmark", "--suite", "quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["results"]) == set(suite.KINDS) and result["targets"]
    assert (tmp_path / "results.md").read_text().startswith("Suite `quick`")


def _exec_line(primitive, implementation, prop_kind, descriptors, problem, ms, attributes="attr-scratchpad:user"):
    """One `exec` line of oneDNN's verbose log (v1 format)."""
    fields = ("onednn_verbose", "v1", "primitive", "exec", "cpu", primitive, implementation, prop_kind)
    return ",".join(fields + (descriptors, attributes, "", problem, str(ms)))


_BF16_AB = "src:bf16::blocked:ab::f0 wei:bf16::blocked:ab::f0 dst:bf16::blocked:ab::f0"
_BF16_IP = "src:bf16::blocked:ab::f0 wei:bf16::blocked:ba::f0 bia:bf16:a:blocked:a::f0 dst:bf16::blocked:ab::f0"
VERBOSE = "\n".join(
    [
        "onednn_verbose,v1,info,oneDNN v3.7.1 (commit 1234)",
        "onednn_verbose,v1,primitive,info,template:operation,engine,primitive,implementation,prop_kind,...",
        "onednn_verbose,v1,primitive,create:cache_miss,cpu,matmul,brg_matmul:avx512_core_amx,undef,src:bf16,,,1x1:1x1,0.9",
        _exec_line("inner_product", "x64:gemm:jit", "forward_training", _BF16_IP, "mb6304ic384oc1536", 21.5),
        _exec_line("inner_product", "x64:gemm:jit", "forward_training", _BF16_IP, "mb6304ic1536oc384", 18.5),
        _exec_line("matmul", "brg_matmul:avx512_core_amx", "undef", _BF16_AB, "6304x384:384x1152", 6.0),
        _exec_line("reorder", "jit:uni", "undef", "src:f32::blocked:ab::f0 dst:bf16::blocked:ab::f0", "384x1152", 0.5),
        _exec_line(
            "inner_product",
            "brgemm:avx512_core_bf16",
            "backward_data",
            "diff_src:bf16::blocked:ab::f0 wei:bf16:a:blocked:AB8b64a2b::f0 diff_dst:bf16::blocked:ab::f0",
            "mb6304ic384oc1536",
            4.0,
        ),
        _exec_line("gemm_api", "", "undef", "src_f32::blocked:ab:f0 wei_f32::blocked:ab:f0", "32x384:384x1000", 0.25),
        "onednn_verbose,v1,graph,exec,cpu,100002,dnnl_backend,,,fpm:strict,,,3.0",
        "keras_vit: a line of the program's own",
    ]
)


def test_kernel_profiles_read_onednn_verbose_output():
    from keras_vit.benchmark import kernels

    records = kernels.parse(VERBOSE)  # exec lines only: not info, primitive creation or oneDNN Graph
    assert [(r["primitive"], r["implementation"], r["dtype"]) for r in records] == [
        ("inner_product", "x64:gemm:jit", "bf16"),
        ("inner_product", "x64:gemm:jit", "bf16"),
        ("matmul", "brg_matmul:avx512_core_amx", "bf16"),
        ("reorder", "jit:uni", "f32>bf16"),
        ("inner_product", "brgemm:avx512_core_bf16", "bf16"),  # a backward primitive: diff_dst's type
        ("gemm_api", "", "f32"),
    ]
    assert records[0]["shape"] == "mb6304ic384oc1536" and records[0]["prop_kind"] == "forward_training"
    profile = kernels.summarize(records + records, steps=2, step_ms=100.0)
    assert profile["onednn_ms"] == pytest.approx(21.5 + 18.5 + 6.0 + 0.5 + 4.0 + 0.25)
    assert profile["amx"] and profile["step_ms"] == 100.0
    top = profile["kernels"][0]
    assert (top["primitive"], top["implementation"], top["calls"]) == ("inner_product", "x64:gemm:jit", 2)
    assert top["ms"] == 40.0
    assert [k["ms"] for k in profile["kernels"]] == sorted((k["ms"] for k in profile["kernels"]), reverse=True)
    assert not kernels.summarize(records[:2])["amx"]


def test_markdown_lists_kernel_profiles():
    result = _result(
        suite="full",
        isa=["amx_bf16"],
        results={
            "inference": [
                dict(case="c", implementation="keras_vit", mode="mixed_bfloat16", compiler="graph", images_per_s=9.0),
                dict(case="c", implementation="timm", mode="compile_bf16", images_per_s=9.0),
            ]
        },
    )
    assert "kernels of one step" not in report.markdown(result)  # a run without --kernels
    from keras_vit.benchmark import kernels

    result["results"]["inference"][0]["kernels"] = kernels.summarize(kernels.parse(VERBOSE), step_ms=80.0)
    result["results"]["inference"][1]["kernels"] = dict(error="the profiling run failed: boom")
    text = report.markdown(result)
    assert "| c | keras_vit | mixed_bfloat16, graph | 50.8 | 80.0 | inner_product x64:gemm:jit bf16: 40.0 (2); " in text
    assert "reorder jit:uni f32>bf16: 0.5 (1); 1 more |" in text
    assert "| c | timm | compile_bf16 |  |  | no profile: the profiling run failed: boom |" in text


@pytest.mark.tensorflow_only
def test_kernel_profiles_of_a_keras_row_and_a_timm_row():
    # A Keras row in a fresh process under ONEDNN_VERBOSE=1 (after its case); a timm row in this one.
    import numpy as np
    import torch

    from keras_vit.benchmark import kernels

    case = mechanics_case("tiny", batch=4)
    row = dict(implementation="keras_vit", mode="mixed_bfloat16", compiler="graph")
    profiler = kernels.Profiler("inference", 2)
    assert profiler(case, row, measure=None) is None  # not while the case's models are loaded
    failing = {**row, "mode": "no-such-policy"}
    profiler.keras_rows(case, [row, failing])
    profile = row["kernels"]
    assert "error" not in profile, profile
    ran = {(k["primitive"], k["dtype"]) for k in profile["kernels"]}
    # TensorFlow gives oneDNN bfloat16 ops only on CPUs with AVX-512 (Eigen runs them elsewhere,
    # e.g. on AMD Zen 3): there the float32 parts still run on oneDNN
    from keras_vit.cpu import cpu_flags

    bf16 = {("matmul", "bf16"), ("softmax", "bf16")} if "avx512f" in (cpu_flags() or set()) else set()
    assert bf16 <= ran and profile["onednn_ms"] > 0 and profile["step_ms"] > 0, ran
    assert profile["amx"] == any("amx" in k["implementation"] for k in profile["kernels"])
    assert failing["kernels"]["error"].startswith("the profiling run failed:")
    module = torch.nn.Conv2d(3, 8, 3)
    images = torch.from_numpy(np.ones((2, 3, 16, 16), "float32"))
    module(images)  # as the suite profiles a timed step: after warm-up
    profile = kernels.Profiler("inference", 2)(case, dict(implementation="timm", mode="eager"), lambda: module(images))
    # which kernel is slowest depends on the CPU (a reorder of the input may be): only that the convolution ran
    assert "convolution" in [k["primitive"] for k in profile["kernels"]] and profile["onednn_ms"] > 0
    print("after the profile")  # this process's stdout works again


@pytest.mark.tensorflow_only
def test_bf16_agreement_on_the_trained_digits_default():
    # A short run of the digits default (half the `quick` case's 20 epochs): its held-out digits,
    # a bf16 copy against float32, one row per Keras mode.
    from keras_vit.benchmark import agreement

    case = dict(name="digits", epochs=10, compilers=("graph", "frozen"))
    rows = agreement.run_case(case, (), repeats=5, log=lambda row: None)
    assert [r["compiler"] for r in rows] == ["graph", "frozen"]
    for row in rows:
        # trained, far above chance (10%): 71% after 8 epochs and 92% after 20 on a Xeon, so with
        # a margin for other CPUs
        assert row["agreement_images"] == 359 and row["top1_float32"] >= 0.6
        assert row["agreement_with_float32"] >= 1 - row["near_ties"]  # only near-ties can flip
        assert 0 < row["max_logit_error"] < 1.0 and abs(row["top1"] - row["top1_float32"]) <= 0.02
    text = report.markdown(_result(results=dict(agreement=rows)))
    assert "### agreement" in text and "| digits | keras_vit | mixed_bfloat16, frozen | " in text


def test_the_benchmark_command_drops_only_the_retracing_warning(caplog):
    import logging

    from keras_vit.benchmark import quiet_retracing

    logger = logging.getLogger("tensorflow")
    filters = list(logger.filters)
    try:
        quiet_retracing()
        with caplog.at_level(logging.WARNING, logger="tensorflow"):
            logger.warning("5 out of the last 13 calls to <function f> triggered tf.function retracing. Tracing ...")
            logger.warning("something else")
        assert [r.getMessage() for r in caplog.records] == ["something else"]
    finally:
        logger.filters[:] = filters


@pytest.mark.backend_independent
def test_timm_imports_for_the_suite_in_a_fresh_process():
    """`--against timm` from the installed command: where torchvision's compiled ops do not load
    beside this torch (the dev environment's CUDA wheel), timm comes in over the stand-in."""
    pytest.importorskip("timm")
    code = "from keras_vit.benchmark.models import import_timm; print(import_timm().__name__)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.split()[-1] == "timm", result.stderr[-2000:]
