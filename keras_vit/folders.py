"""Walking image folders as training, `evaluate` and `predict` list them: links followed, hidden
names (a leading dot) left out, each folder entered once."""

import os


def walk(top, seen=None):
    """`(folder, file names)` of `os.walk(top)` following links to folders, hidden folders left
    out; a folder whose (device, inode) is in `seen` (updated), or is met again, is not entered,
    so a link loop ends."""
    seen = set() if seen is None else seen
    key = folder_key(top)
    if key is None or key in seen:
        return
    seen.add(key)
    for root, folders, names in os.walk(top, followlinks=True):
        kept = []
        for folder in folders:
            key = folder_key(os.path.join(root, folder))
            if not folder.startswith(".") and key is not None and key not in seen:
                seen.add(key)
                kept.append(folder)
        folders[:] = kept
        yield root, names


def folder_key(folder):
    """A folder's (device, inode), links followed; None when it cannot be read."""
    try:
        stat = os.stat(folder)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino
