"""Moving a finished export into `--output_dir`. Each model export lists the names it wrote in its
`export_args.json` ("files"); with --exist_ok an export replaces the files an earlier one listed there
and touches no other file, so a user's files beside an export are never removed and what an earlier
export left is never half of a model (a Modelfile whose GGUF is gone, a config without its weights)."""
from __future__ import annotations

import os
import re
import shutil

from swift.utils.io import read_json

MANIFEST = "export_args.json"
# the weight files transformers loads from a folder (model.safetensors before an index, so a stale
# single file would be loaded instead of new shards), and shards named as transformers names them
CHECKPOINT_FILE = re.compile(r"(model(-\d+-of-\d+)?\.safetensors|pytorch_model(-\d+-of-\d+)?\.bin)(\.index\.json)?")


def listed(folder: str) -> set[str]:
    """The names an earlier export in `folder` wrote, as its manifest lists them (none without one, or
    from an export made before 2026-11-30, whose manifest had no list)."""
    path = os.path.join(folder, MANIFEST)
    try:
        files = read_json(path).get("files") if os.path.isfile(path) else None
    except (ValueError, AttributeError, OSError):  # not JSON, or not an object: not ours
        return set()
    if not isinstance(files, list):
        return set()
    # only plain names in `folder`: a manifest never makes an export remove anything outside it
    return {n for n in files if isinstance(n, str) and n not in ("", ".", "..") and n == os.path.basename(n)}


def unlisted_weights(folder: str) -> list[str]:
    """Weight files in `folder` that no export listed: a checkpoint written beside them could be loaded
    with them, so an HF checkpoint is not written there."""
    if not os.path.isdir(folder):
        return []
    ours = listed(folder)
    return sorted(n for n in os.listdir(folder) if CHECKPOINT_FILE.fullmatch(n) and n not in ours)


def _remove(path: str) -> None:
    shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)


def publish(staging: str, output_dir: str, replaces: tuple[str, ...] = ()) -> list[str]:
    """Move the staged export into `output_dir`; returns the names written. Into an existing folder
    (--exist_ok), the names an earlier export listed (or `replaces`, for a cached dataset, which lists
    its parts in its own info file) go first when this export has none of that name; other files stay."""
    written = sorted(os.listdir(staging))
    if not os.path.isdir(output_dir):
        os.makedirs(os.path.dirname(os.path.abspath(output_dir)), exist_ok=True)
        os.rename(staging, output_dir)
        return written
    earlier = set(replaces) | (listed(output_dir) if MANIFEST in written else set())
    for name in sorted(earlier - set(written)):
        if os.path.lexists(os.path.join(output_dir, name)):
            _remove(os.path.join(output_dir, name))
    for name in written:
        dst = os.path.join(output_dir, name)
        if os.path.isdir(dst) and not os.path.islink(dst):
            shutil.rmtree(dst)
        os.replace(os.path.join(staging, name), dst)
    os.rmdir(staging)
    return written
