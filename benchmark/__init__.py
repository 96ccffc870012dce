"""keras-vit's benchmark suite: keras_vit side by side with keras-hub and timm in one
run (inference, training, LiteRT latency, input pipeline), as ratios and targets.

    keras-vit benchmark --suite quick --against keras-hub,timm --out results.json
"""

from keras_vit.benchmark.accelerator import share_gpu
from keras_vit.benchmark.report import markdown
from keras_vit.benchmark.runner import COMPETITORS, quiet_retracing, run_suite
from keras_vit.benchmark.suite import KINDS, SUITES
from keras_vit.benchmark.timing import pin_threads

__all__ = ["COMPETITORS", "KINDS", "SUITES", "markdown", "pin_threads", "quiet_retracing", "run_suite", "share_gpu"]
