"""Download a model or dataset snapshot from ModelScope (default) or the Hugging Face hub."""
from __future__ import annotations

from swift.utils.registry import SwiftError


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
