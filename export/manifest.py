"""The export's manifest: a `SHA256SUMS` file in each directory export writes (`HEX  PATH` lines,
as `sha256sum` writes and `sha256sum -c` checks), and the check `predict` and `evaluate` make
before they load an exported file: a file changed or damaged since export is refused."""

from pathlib import Path

from keras_vit.checkpoints.known import sha256
from keras_vit.export.source import ExportError
from keras_vit.names import EXPORT_MANIFEST

# The folders above an exported file in which its manifest may lie: the file's own (.tflite,
# .onnx, .xml) or, for a SavedModel's files down to NAME/VERSION/variables/, the export's base
# directory.
_LEVELS = 4


def read(directory):
    """`{relative POSIX path: hex digest}` of `directory`'s manifest ({} when there is none)."""
    path = Path(directory) / EXPORT_MANIFEST
    if not path.is_file():
        return {}
    entries = {}
    for line in path.read_text().splitlines():
        digest, _, name = line.partition("  ")
        if digest and name:
            entries[name.removeprefix("*")] = digest
    return entries


def record(directory, files):
    """Adds the digests of `files` (paths in or under `directory`) to its manifest, keeping the
    entries of files written before that still exist; returns the manifest's path."""
    directory = Path(directory)
    entries = {name: digest for name, digest in read(directory).items() if (directory / name).is_file()}
    for file in files:
        entries[Path(file).relative_to(directory).as_posix()] = sha256(file)
    path = directory / EXPORT_MANIFEST
    path.write_text("".join(f"{entries[name]}  {name}\n" for name in sorted(entries)))
    return path


def record_tree(directory, root):
    """Adds every file under `root` (a folder in `directory`, e.g. a SavedModel version) to
    `directory`'s manifest."""
    return record(directory, sorted(p for p in Path(root).rglob("*") if p.is_file()))


def verify(files):
    """Raises ExportError when a file of `files` (one exported artifact's files) differs from the
    digest its manifest records; files no manifest lists are not checked."""
    for file in map(Path, files):
        for directory in list(file.resolve().parents)[:_LEVELS]:
            recorded = read(directory).get(file.resolve().relative_to(directory).as_posix())
            if recorded is None:
                continue
            if sha256(file) != recorded:
                raise ExportError(
                    f"{file} does not match its SHA-256 in {directory / EXPORT_MANIFEST}: it changed or was damaged "
                    "since export; export it again."
                )
            break
