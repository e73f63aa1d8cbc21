"""A head folder for a local path or a hub id: what loading and publishing a head both need
(kept apart from `specheads.hub`, which writes heads, so that loading imports no publishing)."""

from __future__ import annotations

import os
import re
from pathlib import Path

HEAD_FILES = ["config.json", "model.safetensors", "specheads.json"]
# org/name: letters, digits, '-', '_', '.'; the Hub's own rule, minus '--' and '..'
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")


class HubError(ValueError):
    """A hub id that is malformed, missing, not cached offline, or a repo that would be overwritten."""


def check_repo_id(repo_id: str, what: str = "--repo-id") -> str:
    if not REPO_ID.fullmatch(repo_id) or "--" in repo_id or ".." in repo_id or repo_id.endswith((".", "-")):
        raise HubError(f"{what} {repo_id!r} is not a hub id; expected 'org/name' (letters, digits, '-', '_', '.')")
    return repo_id


def resolve_head(spec: str | os.PathLike) -> Path:
    """A head folder on disk for a local path or a hub id `org/name[@revision]`."""
    path = Path(spec).expanduser()
    if path.exists():
        return path
    repo_id, _, revision = str(spec).partition("@")
    if str(spec).startswith((".", "/", "~")) or not REPO_ID.fullmatch(repo_id):
        raise FileNotFoundError(f"head {str(spec)!r} is neither an existing folder nor a hub id 'org/name[@revision]'")
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    where = f"head {str(spec)!r} is not a local folder, and on the Hub"
    try:
        return Path(snapshot_download(repo_id, revision=revision or None, allow_patterns=HEAD_FILES))
    except RevisionNotFoundError:
        raise HubError(f"{where} {repo_id} has no revision {revision!r}") from None
    except RepositoryNotFoundError:
        raise HubError(f"{where} {repo_id} does not exist (or is private: set HF_TOKEN or "
                       f"run `huggingface-cli login`)") from None
    except LocalEntryNotFoundError:  # offline (HF_HUB_OFFLINE=1 or no connection) and not in the cache
        reason = "HF_HUB_OFFLINE=1" if constants.is_offline_mode() else "the Hub could not be reached"
        raise HubError(f"{where} {repo_id} is not in the cache ({constants.HF_HUB_CACHE}) and {reason}; "
                       f"download it once with network access") from None
    except HfHubHTTPError as e:
        raise HubError(f"{where} {repo_id} could not be fetched: {str(e).splitlines()[0]}") from None


DEFAULT_TARGET_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the embedded GGUF's source


def base_model_id(target: str | None) -> str | None:
    """The target as a hub id, or None where it is a local path (or not recorded)."""
    # the embedded default, by name or as its GGUF file staged elsewhere (e.g. on a GPU box)
    from specheads.target.loader import DEFAULT_TARGET, SMOLLM2_GGUF

    if target == DEFAULT_TARGET or (target and Path(target).name == SMOLLM2_GGUF):
        return DEFAULT_TARGET_HUB_ID
    if (target and not Path(target).exists() and not target.startswith((".", "/", "~"))
            and REPO_ID.fullmatch(target) and "--" not in target and ".." not in target):
        return target
    return None
