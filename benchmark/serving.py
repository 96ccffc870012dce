"""Server runtimes: one model's SavedModel (TensorFlow, as TF Serving runs it), ONNX file (ONNX
Runtime's CPU provider) and OpenVINO IR (its CPU plugin), each as `keras-vit export` writes it,
timed in the same rounds as timm (eager and torch.compile), float32 and bfloat16 (TensorFlow
backend: the exporters need it).

ONNX Runtime's CPU provider has no bfloat16 matmul on x86, so its second row is its dynamic int8
file instead (int8 weights, activations quantised per call). Where `profile` is given, each
runtime row gets the per-op profile of one call from the runtime's own profiler (ONNX Runtime's
session profiling, OpenVINO's performance counters) and each SavedModel row its oneDNN kernels
(`kernels.Profiler`)."""

import functools
import gc
import importlib.util
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from keras_vit.benchmark import inference, models
from keras_vit.benchmark.kernels import grouped, profiled
from keras_vit.benchmark.timing import rate, seconds, throughput_rows

RUNTIMES = ("SavedModel", "onnxruntime", "openvino")
PACKAGES = {"SavedModel": "tensorflow", "onnxruntime": "onnxruntime", "openvino": "openvino"}
# A runtime's modes per Keras precision (the suite's dtypes). ONNX Runtime's CPU provider has no
# bfloat16 matmul on x86: its dynamic int8 file rides with float32 instead.
MODES = {
    "SavedModel": {"float32": ("float32",), "mixed_bfloat16": ("bfloat16",)},
    "onnxruntime": {"float32": ("float32", "dynamic"), "mixed_bfloat16": ()},
    "openvino": {"float32": ("float32",), "mixed_bfloat16": ("bfloat16",)},
}
PROFILED_CALLS = 2  # a runtime row's profile: the mean over this many calls, after its timed rounds


def run_case(case, against, repeats, log, peak_probe=None, profile=None):
    """Throughput of the case's model (random weights, a random head) in each runtime of
    `case["runtimes"]` that is installed, in its modes for the precisions `case["dtypes"]`
    (`MODES`), and of timm's `case["timm_modes"]` where `against` has timm; rows of implementation
    "SavedModel", "onnxruntime", "openvino" or "timm", each runtime row with the seconds its
    export took and its top-1 agreement with the Keras float32 model on the timed batch. With
    `profile`, the runtime rows get their runtime's per-op profile (`kernels`), timm's rows
    their oneDNN kernels; the SavedModel rows' come after the case (`kernels.Profiler`)."""
    import keras

    keras.utils.set_random_seed(0)
    config = models.config_for(case["model"])
    batch = case["batch"]
    images = np.random.default_rng(0).uniform(0, 255, (batch,) + tuple(config.image_size) + (3,)).astype("float32")
    installed = []
    for runtime in case.get("runtimes", RUNTIMES):
        if importlib.util.find_spec(PACKAGES[runtime]) is None:
            log(f"{case['name']}: no {runtime} rows: {PACKAGES[runtime]} is not installed.")
        else:
            installed.append(runtime)
    if "openvino" in installed:
        from keras_vit.export import openvino_model

        openvino_modes = openvino_model.cpu_modes()
    rows, steps, runners = [], [], []
    with tempfile.TemporaryDirectory() as folder:
        model = inference.random_head(models.build_keras_vit(config))
        converted = {}
        reference = np.asarray(model.predict_on_batch(images))
        for runtime in installed:
            for mode in (m for dtype in case["dtypes"] for m in MODES[runtime][dtype]):
                if runtime == "openvino" and mode not in openvino_modes:
                    log(f"{case['name']}: no OpenVINO bfloat16 row: its CPU plugin finds no BF16 on this CPU.")
                    continue
                build = functools.partial(_runner, runtime, mode, model, Path(folder), images, converted)
                made, runner = seconds(build)
                gc.collect()  # the conversion's graphs: a B/16 case holds ten models besides
                step = functools.partial(runner.predict, images)
                first, probabilities = seconds(step)
                rows.append(
                    dict(
                        case=case["name"],
                        implementation=runtime,
                        mode=mode,
                        export_s=made,
                        first_call_s=first,
                        agreement_with_float32=inference.agreement(probabilities, reference),
                        agreement_images=batch,
                    )
                )
                steps.append(step)
                runners.append(runner)
        del model, converted
        if "timm" in against:
            module = models.build_timm(config)
            for mode in case["timm_modes"]:
                step = inference.timm_step(module, images, mode)
                rows.append(dict(case=case["name"], implementation="timm", mode=mode, first_call_s=seconds(step)[0]))
                steps.append(step)
        measures = [functools.partial(rate, step, batch) for step in steps]
        flops = models.forward_flops(config) / 1e9
        rows = throughput_rows(rows, measures, repeats, flops, log, peak_probe=peak_probe)
        for row, runner in zip(rows, runners) if profile is not None else ():
            if hasattr(runner, "profile"):
                row["kernels"] = runner.profile(images, PROFILED_CALLS)
    return profiled(rows, measures, case, profile)


def _runner(runtime, mode, model, folder, images, converted):
    """The runtime's runner of `model` exported in `mode` to a file under `folder`; the case's
    float32 ONNX graph is converted once, into `converted` (TensorFlow keeps what each conversion
    traced: gigabytes for B/16)."""
    from keras_vit.export import litert, onnx_model, openvino_model

    if runtime == "SavedModel":
        return SavedModelRunner(model, mode, folder / f"saved_model_{mode}")
    if "onnx" not in converted:  # any batch, as `keras-vit export` writes them
        converted["onnx"] = onnx_model.convert(litert.keras_module(model, batch=None), {})
    if runtime == "onnxruntime":
        path = folder / f"onnx_{mode}.onnx"
        path.write_bytes(onnx_model.quantize(converted["onnx"], mode, images))
        return OnnxRunner(path)
    if "openvino" not in converted:
        converted["openvino"] = openvino_model.convert(onnx_bytes=converted["onnx"])
    path, _ = openvino_model.save(converted["openvino"], folder / f"openvino_{mode}.xml", mode, {})
    return OpenVINORunner(path)


class SavedModelRunner:
    """The SavedModel `keras-vit export --saved-model` writes for `model` in `mode` ("float32", or
    "bfloat16": a mixed_bfloat16 copy, frozen), loaded back and called through its
    serving_default signature, as TF Serving calls it (without the RPC)."""

    def __init__(self, model, mode, path):
        import tensorflow as tf

        from keras_vit.export.serving import IMAGES_SIGNATURE, save_serving_model
        from keras_vit.export.source import ExportSource

        labels = [f"class {i}" for i in range(model.config.num_classes)]
        target = save_serving_model(ExportSource(model, labels), path, precision=mode, warmup=False)
        self._signature = tf.saved_model.load(str(target)).signatures[IMAGES_SIGNATURE]

    def predict(self, images):
        return self._signature(images=images)["probabilities"].numpy()


class OnnxRunner:
    """An ONNX file (`path`) on ONNX Runtime's CPU provider (`keras_vit.export.onnx_model.OnnxModel`)."""

    def __init__(self, path, threads=None):
        from keras_vit.export import onnx_model

        self._path = path
        self._model = onnx_model.OnnxModel(path.read_bytes(), **({"num_threads": threads} if threads else {}))

    def predict(self, images):
        return self._model.predict(images, len(images))

    def profile(self, images, calls):
        """Per op type, ms per call, from ONNX Runtime's session profiler (a second session of
        the same file, so that the timed one carries no profiling); its first call, a warm-up,
        left out."""
        import onnxruntime as ort

        with tempfile.TemporaryDirectory() as folder:
            options = ort.SessionOptions()
            options.intra_op_num_threads = self._model.session.get_session_options().intra_op_num_threads
            options.inter_op_num_threads, options.log_severity_level = 1, 3
            options.enable_profiling, options.profile_file_prefix = True, str(Path(folder) / "profile")
            session = ort.InferenceSession(str(self._path), options, providers=["CPUExecutionProvider"])
            feed = {session.get_inputs()[0].name: images}
            for _ in range(calls + 1):
                session.run(None, feed)
            events = json.loads(Path(session.end_profiling()).read_text())
        runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
        warmup_end = runs[0]["ts"] + runs[0]["dur"]
        records = [
            dict(
                primitive=e["args"].get("op_name", "?"),
                implementation=e["args"].get("provider", "").replace("ExecutionProvider", ""),
                dtype=_onnx_dtype(e["args"]),
                ms=e["dur"] / 1e3,
            )
            for e in events
            if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") and e["ts"] > warmup_end
        ]
        step_ms = float(np.mean([r["dur"] / 1e3 for r in runs[1:]]))
        return runtime_profile(records, calls, step_ms, "ONNX Runtime's profiler")


def _onnx_dtype(args):
    inputs = args.get("input_type_shape") or [{}]
    return next(iter(inputs[0]), "?").replace("tensor(", "").replace(")", "") if inputs[0] else "?"


class OpenVINORunner:
    """An OpenVINO IR on its CPU plugin in the precision the file records
    (`keras_vit.export.openvino_model.OpenVINOModel`)."""

    def __init__(self, path, threads=None):
        from keras_vit.export import openvino_model

        self._path = path
        self._model = openvino_model.OpenVINOModel(path, **({"num_threads": threads} if threads else {}))

    def predict(self, images):
        return self._model.predict(images, len(images))

    def profile(self, images, calls):
        """Per layer type, implementation and precision, ms per call, from OpenVINO's
        performance counters (a second compilation with PERF_COUNT on)."""
        import openvino as ov

        core = ov.Core()
        threads = self._model.compiled.get_property("INFERENCE_NUM_THREADS")
        config = {"INFERENCE_PRECISION_HINT": self._model.precision, "INFERENCE_NUM_THREADS": threads}
        compiled = core.compile_model(core.read_model(str(self._path)), "CPU", {**config, "PERF_COUNT": True})
        request = compiled.create_infer_request()
        request.infer([images])  # warm-up
        records, wall = [], []
        for _ in range(calls):
            start = time.perf_counter()
            request.infer([images])
            wall.append((time.perf_counter() - start) * 1e3)
            for info in request.profiling_info:
                if info.status == info.Status.EXECUTED:
                    exec_type = info.exec_type
                    precision = exec_type.rsplit("_", 1)[-1] if "_" in exec_type else "?"
                    records.append(
                        dict(
                            primitive=info.node_type,
                            implementation=exec_type.rsplit("_", 1)[0] if "_" in exec_type else exec_type,
                            dtype=precision,
                            ms=info.real_time.total_seconds() * 1e3,
                        )
                    )
        return runtime_profile(records, calls, float(np.mean(wall)), "OpenVINO's performance counters")


def runtime_profile(records, calls, step_ms, source):
    """A runtime's profile: its ops grouped as `kernels.grouped` groups oneDNN's (op type as the
    primitive, the runtime's implementation, data type), `profiled_ms` (their sum per call),
    `step_ms` and `source` (the profiler)."""
    ops = grouped(records, calls)
    return dict(source=source, profiled_ms=sum(g["ms"] for g in ops), step_ms=step_ms, kernels=ops)
