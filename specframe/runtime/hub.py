"""Hugging Face model ids (`org/name`) resolved to a local snapshot through `huggingface_hub`.

specframe never changes the user's hub settings: with `HF_HUB_OFFLINE=1` (or no network) a model comes
from the user's cache (`HF_HUB_CACHE`, by default `~/.cache/huggingface/hub`) or is refused with how to
fetch it; online, the files a causal LM needs are downloaded into that cache as `huggingface-cli download`
would. Only safetensors weights are fetched: pickled `.bin` checkpoints can run code when loaded.
"""

from __future__ import annotations

import re
from pathlib import Path

from specframe.terms.errors import ModelLoadError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# What a model needs: config, generation config, tokenizer files, safetensors weights (and their index).
HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja"]


def looks_like_hub_id(name: str) -> bool:
    """True for `org/name` that is not a path on this machine (checked by the caller first)."""
    return bool(HUB_ID.match(name)) and ".." not in name


def hub_snapshot(repo_id: str, revision: str | None = None) -> Path:
    """The local snapshot directory of `repo_id`, from the cache or downloaded into it."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=HUB_FILES))
    except GatedRepoError:
        raise ModelLoadError(f"model '{repo_id}' is gated on the Hugging Face hub: accept its licence on "
                             "its page and log in (`hf auth login`), or pass a local directory") from None
    except RepositoryNotFoundError:
        raise ModelLoadError(f"model '{repo_id}' is not on the Hugging Face hub (or is private): check the "
                             "id, or pass a local directory, a .gguf file or an alias") from None
    except RevisionNotFoundError:
        raise ModelLoadError(f"model '{repo_id}' has no revision {revision!r}") from None
    except LocalEntryNotFoundError:
        raise ModelLoadError(
            f"model '{repo_id}' is not in the Hugging Face cache and cannot be downloaded now (offline: "
            "HF_HUB_OFFLINE is set, or no network). Fetch it once where there is a network with "
            f"`hf download {repo_id}` (same HF_HOME), or pass a local directory") from None
    except (HfHubHTTPError, OSError) as err:
        raise ModelLoadError(f"cannot fetch model '{repo_id}' from the Hugging Face hub: "
                             f"{' '.join(str(err).split())}") from None
