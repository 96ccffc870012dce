"""The documentation against the code: every `keras-vit` command shown in a ```bash block of
README.md or docs/*.md parses with the current command line, and every image, file and heading
the pages link exists. Parsing builds the CLI's argparse parser in this process (no Keras, nothing runs)."""

import argparse
import contextlib
import io
import re
import shlex
import sys
from pathlib import Path

import pytest

from keras_vit_cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HTML_IMAGE = re.compile(r"<img[^>]+src=\"([^\"]+)\"")
_SHELL_BREAKS = {"&&", "||", ";", "|", "(", ")"}


def _parser():
    """The `keras-vit` parser with abbreviations off, so that a misspelled or shortened flag is an
    error rather than a prefix of a real one (argparse takes `--epoch` for `--epochs`)."""
    parser = build_parser()
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                subparser.allow_abbrev = False
    return parser


def _bash_blocks(page):
    for match in _FENCE.finditer(page.read_text()):
        if match.group(1) in ("bash", "sh", "shell", "console"):
            yield match.group(2)


def _commands(block):
    """The argument lists of the `keras-vit` invocations in a bash block: line continuations
    joined, comments dropped, split at `&&`, `;`, `|` and the like, leading VAR=value
    assignments skipped."""
    text = block.replace("\\\n", " ")
    for line in text.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        segment = []
        for token in [*lexer, ";"]:
            if token not in _SHELL_BREAKS:
                segment.append(token)
                continue
            words = segment
            while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
                words = words[1:]
            if words and words[0] == "keras-vit":
                yield words[1:]
            segment = []


def _documented_commands():
    found = []
    for page in PAGES:
        for block in _bash_blocks(page):
            for argv in _commands(block):
                found.append((f"{page.relative_to(ROOT)}: keras-vit {shlex.join(argv)}", argv))
    return found


COMMANDS = _documented_commands()


def _parse_error(argv):
    """None if `keras-vit ARGV` parses; else argparse's message."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            _parser().parse_args(argv)
    except SystemExit as exit:
        if exit.code not in (0, None):  # --help exits 0
            return stderr.getvalue().strip().splitlines()[-1]
    return None


def test_the_docs_show_commands_of_every_subcommand():
    shown = {argv[0] for _, argv in COMMANDS if argv and not argv[0].startswith("-")}
    assert len(COMMANDS) >= 20, COMMANDS
    parser = _parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert shown >= set(subcommands), sorted(set(subcommands) - shown)
    readme = [where for where, _ in COMMANDS if where.startswith("README.md")]
    assert len(readme) >= 8, readme


@pytest.mark.parametrize("where, argv", COMMANDS, ids=[where for where, _ in COMMANDS])
def test_documented_command_parses(where, argv):
    assert _parse_error(argv) is None, f"{where}\n  {_parse_error(argv)}"


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--epoch", "5"],  # a prefix of --epochs
        ["train", "--run_dir", "runs/x"],
        ["export", "runs/digits", "--tflite", "out", "--quantise", "int8"],
        ["predict", "m.keras", "x.png", "--top-k", "three"],
        ["benchmark", "--suite", "full"],  # --out is required
        ["visualise", "m.keras", "x.png", "--out", "y.png"],
        ["train", "--epochs", "five"],
    ],
)
def test_a_misspelled_flag_command_or_value_fails(argv):
    assert _parse_error(argv) is not None


def test_command_extraction_handles_continuations_comments_and_prefixes():
    block = (
        "KERAS_BACKEND=jax keras-vit benchmark --suite gpu \\\n    --out gpu.json   # a comment\n"
        "pip install x && keras-vit train --epochs 2; echo done\n"
        "docker run image   # not ours\n"
    )
    assert list(_commands(block)) == [
        ["benchmark", "--suite", "gpu", "--out", "gpu.json"],
        ["train", "--epochs", "2"],
    ]


def _targets(page):
    """The relative link targets of a page (`path` or `path#anchor`), code blocks left out."""
    text = _FENCE.sub("", page.read_text())  # links inside code blocks are code, not links
    for target in [*_LINK.findall(text), *_HTML_IMAGE.findall(text)]:
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # not a URL
            yield target


def _links(page):
    return [t.split("#")[0] for t in _targets(page) if not t.startswith("#")]


def _anchors(page):
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    text = _FENCE.sub("", page.read_text())
    headings = re.findall(r"^#+\s+(.*?)\s*$", text, re.MULTILINE)
    return {re.sub(r"[^a-z0-9 _-]", "", h.lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_linked_image_and_file_exists(page):
    missing = [t for t in _links(page) if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"
    wrong = []
    for target in _targets(page):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path) if path else page
        if anchor and linked.suffix == ".md" and linked.exists() and anchor not in _anchors(linked):
            wrong.append(target)
    assert not wrong, f"{page.relative_to(ROOT)} links to headings that do not exist: {wrong}"


def test_the_inspection_figures_are_in_docs_images():
    images = {t for page in PAGES for t in _links(page) if t.endswith((".png", ".svg"))}
    assert any("rollout" in t for t in images) and any("attention_distance" in t for t in images), images
    assert any("position_similarity" in t for t in images) and any("patch_embedding" in t for t in images), images


def test_benchmark_chart_has_a_panel_per_case(tmp_path):
    """`keras-vit benchmark` draws its result as bars next to its Markdown table."""
    pytest.importorskip("matplotlib")
    from PIL import Image

    from keras_vit.benchmark import report

    rows = dict(
        inference=[
            dict(case="S/16 inference b32", implementation=i, mode="float32", compiler=c, images_per_s=v)
            for i, c, v in (("keras_vit", "graph", 20.0), ("keras-hub", "xla", 18.0), ("timm", None, 16.0))
        ],
        litert=[dict(case="S/16 LiteRT b1", implementation="keras_vit", mode="int8", latency_ms=17.0)],
    )
    result = dict(date="2026-11-24", suite="full", backend="tensorflow", machine=dict(cpu="AMD EPYC"), results=rows)
    path = report.chart(result, tmp_path / "results.png")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size[1] > 150
    assert report.chart(dict(result, results={}), tmp_path / "empty.png") is None


def test_the_scaling_tables_are_current_and_count_every_parameter():
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import make_scaling
    finally:
        sys.path.pop(0)
    page = (ROOT / "docs" / "scaling.md").read_text()
    for name, table in (("estimate", make_scaling.estimate_table()), ("plan", make_scaling.planning_table())):
        current = page.split(f"<!-- {name} table: python docs/make_scaling.py -->\n")[1].split("\n<!-- end")[0]
        assert current == table, name
    import keras_vit
    from keras_vit.distribution import parameter_counts

    for name, fields in (("vit_ti16", {}), ("vit_s16", {}), ("vit_ti16", dict(classifier="gap", mlp_dim=1000))):
        config = keras_vit.get_config(name, num_classes=1000, **fields)
        assert sum(parameter_counts(config)) == keras_vit.ViT(config).count_params(), fields


def test_every_mesh_of_the_scaling_plan_is_one_train_accepts():
    """Each plan's flags parse as `keras-vit train` options (with the --process-id and
    --job-addresses a host adds) into a `TrainConfig`, split the model, keep each replica within
    a host and make up the batch of 4096: replicas x --batch-size x --accumulate."""
    import keras_vit
    from keras_vit.distribution import check_model_parallel
    from keras_vit.training import TrainConfig

    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import make_scaling
    finally:
        sys.path.pop(0)
    plans = re.findall(r"\| `(--preset [^`]*)` \| `(--preset [^`]*)` \|", make_scaling.planning_table())
    rows = make_scaling.planning_table().splitlines()[2:]
    assert len(plans) == len(rows) == len(make_scaling.MODELS) * len(make_scaling.MACHINES)
    for row, pair in zip(rows, plans):
        machine = row.split(" | ")[1]
        devices, _, hosts = make_scaling.MACHINES[machine]
        for flags in pair:
            words = flags.split() + (["--process-id", "0", "--job-addresses", "host0:1234"] if hosts > 1 else [])
            args = build_parser().parse_args(["train", *words])
            config = TrainConfig(
                preset=args.preset, model_parallel=args.model_parallel or 1, accumulate=args.accumulate or 1
            )
            check_model_parallel(keras_vit.get_config(config.preset), config.model_parallel)
            assert (args.num_processes or 1) == hosts and (devices // hosts) % config.model_parallel == 0, flags
            replicas = devices // config.model_parallel
            assert replicas * args.batch_size * config.accumulate == make_scaling.BATCH, flags


def _make_figures():
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import make_figures
    finally:
        sys.path.pop(0)
    return make_figures


def test_every_committed_figure_was_drawn_by_the_code_that_titles_it_now():
    """docs/make_figures.py stamps each figure with a hash of the functions that draw its titles;
    a figure whose stamp differs was drawn before that code changed (redraw it with the script:
    `python docs/make_figures.py --run-dir RUN`, and `--benchmark RESULT.json` for the chart)."""
    from PIL import Image

    make_figures = _make_figures()
    figures = sorted((ROOT / "docs" / "images").glob("*.png"))
    assert len(figures) >= 7 and set(make_figures.TITLE_CODE) >= {f.name for f in figures}, figures
    stale = []
    for figure in figures:
        with Image.open(figure) as image:
            drawn_by = image.text.get(make_figures.TITLE_CODE_KEY)
        if drawn_by != make_figures.title_code_hash(figure.name):
            stale.append(f"{figure.name} (stamp {drawn_by})")
    assert not stale, f"figures older than the code that titles them: {stale}"


def test_the_figure_stamp_follows_code_not_comments(tmp_path):
    """The stamp changes with the title-drawing code (the class-token title that outlived its fix)
    and not with a comment, a docstring or the formatting."""
    make_figures = _make_figures()
    figure = "digits_class_token_attention.png"
    (tmp_path / "keras_vit").mkdir()
    source = (ROOT / "keras_vit" / "plot.py").read_text()
    assert source.count('"the mean of the tokens" if mean_pooled else "the class token"') == 1
    current = make_figures.title_code_hash(figure)

    def stamp(text):
        (tmp_path / "keras_vit" / "plot.py").write_text(text)
        return make_figures.title_code_hash(figure, root=tmp_path)

    assert stamp(source) == current
    reworded = source.replace("Attention of {query} to each patch", "Attention of  {query} to each patch")
    assert reworded != source and stamp(reworded) != current
    old = source.replace('"the mean of the tokens" if mean_pooled else "the class token"', '"the class token"')
    assert stamp(old) != current
    commented = source.replace(
        "    plt = _pyplot()\n    maps = np.asarray(maps)[:, image_index]\n",
        "    plt = _pyplot()  # pyplot\n\n    maps = np.asarray(maps)[:, image_index]\n",
    )
    assert commented != source and stamp(commented) == current
    documented = source.replace('"""Raw class-token attention per layer', '"""The raw attention per layer')
    assert documented != source and stamp(documented) == current


_DATE = re.compile(r"\b20[0-9]{2}-[0-9]{2}-[0-9]{2}\b")
# A commit hash: 7 to 40 hex digits with both a digit and a letter, as a word (the issue's
# `[0-9a-f]{7,}` also matches numbers such as 1000000 and hex-letter words such as "defaced";
# a hash of digits or of letters alone is rare enough to leave to review).
_HASH = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")


def _machine_header_lines(page):
    """Line numbers of benchmarks.md's machine headers: from a `### ` heading (one machine) to its
    table."""
    lines, inside = set(), False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("### "):
            inside = True
        elif line.startswith("|") or line.startswith("#"):
            inside = False
        if inside:
            lines.add(number)
    return lines


def test_dates_and_commits_appear_only_in_the_benchmarks_machine_headers():
    """The docs are a reference, not a lab notebook: a dated run or a commit belongs to the
    CHANGELOG (not checked here) or to the machine header of docs/benchmarks.md that it measured."""
    found = []
    for page in PAGES:
        allowed = _machine_header_lines(page) if page.name == "benchmarks.md" else set()
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for match in [*_DATE.findall(line), *_HASH.findall(line)]:
                if number not in allowed:
                    found.append(f"{page.relative_to(ROOT)}:{number}: {match}")
    assert not found, found
    benchmarks = (ROOT / "docs" / "benchmarks.md").read_text()
    assert _DATE.search(benchmarks) and _HASH.search(benchmarks)  # the check sees what it looks for
    assert _HASH.findall("code of 997d194, 1000000 images, defaced") == ["997d194"]


def test_the_performance_page_is_a_reference_of_at_most_150_lines():
    page = (ROOT / "docs" / "performance.md").read_text()
    assert len(page.splitlines()) <= 150
    assert "## What bounds each figure" in page and "## Choices in the code" in page


@pytest.mark.parametrize("page", ["models.md", "checkpoints.md", "training.md"])
def test_reference_pages_hold_no_timings_and_link_to_the_benchmarks(page):
    """Timings live in benchmarks.md (rates) and performance.md (the measurements behind a
    choice); the reference pages link there."""
    text = _FENCE.sub("", (ROOT / "docs" / page).read_text())
    timings = re.findall(r"\b[0-9][0-9.,]*(?:-[0-9.]+)? ?(?:ms|images/s|GFLOP/s|TFLOP/s)\b", text)
    timings += re.findall(r"\b[0-9][0-9.]*(?:-[0-9.]+)? ?s (?:instead|against|for|a step|per)\b", text)
    assert not timings, timings
    assert "](benchmarks.md" in text
