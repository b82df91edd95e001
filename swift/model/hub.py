"""Download a model or dataset snapshot from ModelScope (default) or the Hugging Face hub."""
from __future__ import annotations

import fnmatch
import os

from swift.utils.registry import SwiftError

# an HF checkpoint's weight files: an upload that has any replaces all of them in the repo, since a stale one
# would load (transformers takes model.safetensors before an index, PEFT safetensors before .bin). GGUF files
# are picked by name, so a repo keeps its other quantizations.
# The names transformers and PEFT load at the repo's top level (a `*` pattern would also match files
# in subfolders, such as another quantization kept there).
WEIGHT_PATTERNS = ["model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                   "pytorch_model-*-of-*.bin", "pytorch_model.bin.index.json", "adapter_model.safetensors",
                   "adapter_model.bin"]


def _is_weight(path: str) -> bool:
    return "/" not in path and any(fnmatch.fnmatch(path, p) for p in WEIGHT_PATTERNS)


def snapshot_download(repo_id: str, *, use_hf: bool, revision: str | None = None, repo_type: str = "model") -> str:
    hub = "Hugging Face" if use_hf else "ModelScope"
    try:
        if use_hf:
            from huggingface_hub import snapshot_download as hf_download

            return hf_download(repo_id, revision=revision, repo_type=repo_type)
        from modelscope.hub.snapshot_download import dataset_snapshot_download
        from modelscope.hub.snapshot_download import snapshot_download as ms_download

        if repo_type == "dataset":
            return dataset_snapshot_download(repo_id, revision=revision)
        return ms_download(repo_id, revision=revision)
    except Exception as e:  # network errors come in many types across the two hub clients
        reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise SwiftError(
            f"cannot download {repo_type} '{repo_id}' from the {hub} hub ({reason}); "
            f"the hub may be unreachable: pass a local path instead") from None


def push_to_hub(folder: str, repo_id: str, *, use_hf: bool, token: str | None = None, private: bool = False,
                commit_message: str = "update files", files: list[str] | None = None) -> str:
    """Upload the files of `folder` (all, or the top-level names in `files`) to the model repo `repo_id`
    on ModelScope (default) or the Hugging Face hub (`$HF_ENDPOINT` names another server); returns the
    commit's URL or id. A missing repo is created (private with `private`); an existing one keeps its
    visibility. When the upload has weight files, the repo's other weight files are deleted."""
    allow = [f"{name}/**" if os.path.isdir(os.path.join(folder, name)) else name for name in files] if files else None
    uploaded = {os.path.relpath(os.path.join(root, f), folder).replace(os.sep, "/")
                for root, _, names in os.walk(folder) for f in names}
    if files:
        uploaded = {p for p in uploaded if p.split("/", 1)[0] in files}
    replaces_weights = any(_is_weight(p) for p in uploaded)
    hub = "Hugging Face" if use_hf else "ModelScope"
    try:
        if use_hf:
            from huggingface_hub import HfApi

            api = HfApi(token=token)
            api.create_repo(repo_id, private=private, exist_ok=True)
            # in the same commit; huggingface_hub leaves out the paths this upload writes
            return api.upload_folder(folder_path=folder, repo_id=repo_id, commit_message=commit_message,
                                     allow_patterns=allow,
                                     delete_patterns=WEIGHT_PATTERNS if replaces_weights else None).commit_url
        from modelscope_hub.api import HubApi
        from modelscope_hub.errors import AlreadyExistsError

        api = HubApi(token=token)
        try:
            api.create_repo(repo_id, "model", visibility="private" if private else "public")
        except AlreadyExistsError:
            pass
        info = api.upload_folder(repo_id, "model", folder, commit_message=commit_message, allow_patterns=allow)
        if replaces_weights:  # ModelScope's upload has no delete patterns: a second commit, after the upload
            stale = [f.path for f in api.list_repo_files(repo_id, "model") if _is_weight(f.path)
                     and f.path not in uploaded]
            if stale:
                api.delete_files(repo_id, "model", stale, commit_message=f"{commit_message} (stale weight files)")
        return str(info.get("commit_url") or info) if isinstance(info, dict) else str(info)
    except Exception as e:  # network and server errors come in many types across the two hub clients
        reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise SwiftError(f"--push_to_hub: cannot upload {folder} to '{repo_id}' on the {hub} hub ({reason}); "
                         "the hub may be unreachable") from None
