"""EAGLE checkpoints as the engines load them: a directory with `config.json` and safetensors weights.

- **EAGLE** (EAGLE-1/2, SafeAILab's layout): a Llama config (`num_hidden_layers` decoder layers, usually
  1) and the keys `fc.weight` (H, 2H) (+ `fc.bias`), `layers.{i}.self_attn.{q,k,v,o}_proj.weight`,
  `layers.{i}.mlp.{gate,up,down}_proj.weight`, `layers.{i}.post_attention_layernorm.weight` and, from the
  second layer on, `layers.{i}.input_layernorm.weight`.
- **EAGLE-3**: a config with `draft_vocab_size` (often `architectures: ["LlamaForCausalLMEagle3"]`, and an
  `eagle_config` naming the target layers it reads), the keys `midlayer.*` (or `layers.0.*`, as SpecForge
  writes), `fc.weight` (H, 3H), `norm.weight`, `lm_head.weight` (draft vocab, H), `d2t` and `t2d`.

Either may carry `embed_tokens.weight`, a copy of the target's embedding: it is checked for shape and not
used (the target's own is). A `model.` prefix on every key is dropped. Pickled weights (`.bin`, `.pt`) are
refused, never unpickled: loading a pickle can run any code. A hub id is looked up in the local Hugging Face
cache only; nothing is downloaded when a drafter is built.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

import specframe
from specframe import ModelLoadError
from specframe.kit.files import read_json, write_atomically
from specframe_eagle.head import EagleHead, HeadConfig

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # `org/name`, when no such path exists here
CONFIG = "config.json"
ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings")  # what rotary reads
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
PICKLES = ("*.bin", "*.pt", "*.pth", "*.ckpt")
CONVERT = ("convert it once, where you trust the file, to safetensors beside its config.json: "
           "python -c \"import torch; from safetensors.torch import save_file; save_file({k: v.contiguous() "
           "for k, v in torch.load('pytorch_model.bin', weights_only=True).items()}, 'model.safetensors')\"")


class EagleHeadMismatch(ModelLoadError):
    """The head was trained for another target (hidden size, vocabulary or layer count differ)."""


def resolve(spec: str) -> Path:
    """The local directory of the head `spec`: a directory, a `.safetensors` file (its directory), or a
    Hugging Face id found in the local cache."""
    path = Path(spec).expanduser()
    if path.is_file():
        path = path.parent
    if path.is_dir():
        return path
    if not HUB_ID.match(spec) or ".." in spec:
        raise ModelLoadError(f"eagle: no EAGLE head at '{spec}': pass a directory with config.json and "
                             "model.safetensors, or a Hugging Face id in your local cache")
    return cached_snapshot(spec)


def cached_snapshot(repo_id: str) -> Path:
    """The snapshot of `repo_id` in the local Hugging Face cache, never downloaded."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        raise ModelLoadError(
            f"eagle: no directory '{repo_id}' here, and the head '{repo_id}' is not in the local Hugging "
            "Face cache; specframe downloads nothing at run time (HF_HUB_OFFLINE): fetch it once with "
            f"`hf download {repo_id} config.json model.safetensors` (same HF_HOME), or pass a local "
            "directory") from None


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the head's safetensors files, names as stored; pickles refused."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if (directory / INDEX).is_file():
        index = read_json(directory / INDEX, "fix or remove the index", ModelLoadError)
        shards = sorted(set((index.get("weight_map") or {}).values())) if isinstance(index, dict) else []
        files = [directory / name for name in shards if "/" not in name and ".." not in name]
    else:
        files = [directory / WEIGHTS] if (directory / WEIGHTS).is_file() else sorted(directory.glob(
            "*.safetensors"))
    if not files:
        pickles = sorted(p.name for pattern in PICKLES for p in directory.glob(pattern))
        if pickles:
            raise ModelLoadError(
                f"eagle: the head in {directory} has only pickled weights ({', '.join(pickles)}), which "
                f"specframe never loads (unpickling can run any code); {CONVERT}")
        raise ModelLoadError(f"eagle: no safetensors weights in {directory} (looked for {WEIGHTS})")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            tensors.update(load_file(str(file)))
        except (SafetensorError, OSError, ValueError, RuntimeError) as err:
            raise ModelLoadError(f"eagle: {file} is not a readable safetensors file "
                                 f"({' '.join(str(err).split())})") from None
    if tensors and all(name.startswith("model.") for name in tensors):
        tensors = {name[len("model."):]: t for name, t in tensors.items()}
    return tensors


def head_config(raw: dict, tensors: dict[str, torch.Tensor], target: specframe.Target,
                where: str) -> HeadConfig:
    """The head's sizes from its config, checked against the target it drafts for."""
    def number(key, default=None, kind=int):
        value = raw.get(key, default)
        if value is None:
            value = default
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0 or (
                kind is int and value != int(value)):
            raise ModelLoadError(f"eagle: {where} has {key}={value!r}, not a positive number")
        return kind(value)

    eagle3 = ("draft_vocab_size" in raw or any("Eagle3" in str(a) for a in raw.get("architectures") or [])
              or any(name.startswith("midlayer.") for name in tensors))
    hidden = number("hidden_size")
    heads = number("num_attention_heads")
    vocab = number("vocab_size")
    target_hidden = int(target.model.get_input_embeddings().weight.shape[1])
    target_vocab = int(target.model.get_input_embeddings().weight.shape[0])
    problems = []
    if hidden != target_hidden or number("target_hidden_size", hidden) != target_hidden:
        problems.append(f"hidden size {hidden} vs the target's {target_hidden}")
    if vocab != target_vocab:
        problems.append(f"vocabulary {vocab} vs the target's {target_vocab}")
    layers = int(getattr(target.config, "num_hidden_layers", 0) or 0)
    feature_layers = None
    eagle_config = raw.get("eagle_config") if isinstance(raw.get("eagle_config"), dict) else {}
    if eagle3 and eagle_config.get("use_aux_hidden_state", True):
        ids = eagle_config.get("eagle_aux_hidden_state_layer_ids") or [2, layers // 2, layers - 3]
        ids = ids if isinstance(ids, list) else [ids]
        feature_layers = tuple(i for i in ids if isinstance(i, int) and not isinstance(i, bool))
        if len(feature_layers) != len(ids) or len(feature_layers) < 2:
            raise ModelLoadError(f"eagle: {where} names eagle_aux_hidden_state_layer_ids {ids!r}, not two or "
                                 "more layer numbers")
        if not all(0 <= i <= layers for i in feature_layers):
            problems.append(f"it reads the target's hidden states {list(feature_layers)}, but the target has "
                            f"{layers} layers (hidden states 0 to {layers})")
    if problems:
        raise EagleHeadMismatch(
            f"eagle: the head in {where} does not fit target '{target.name}': {'; '.join(problems)}. It was "
            "trained for another model: pass a head trained for this one, or train one with "
            f"`specframe train eagle --model {target.name}`")
    rope = {key: raw[key] for key in ROPE_KEYS if raw.get(key) is not None}
    return HeadConfig(
        form="eagle3" if eagle3 else "eagle", hidden_size=hidden, num_heads=heads,
        num_kv_heads=number("num_key_value_heads", heads), head_dim=number("head_dim", hidden // heads),
        intermediate_size=number("intermediate_size"),
        layers=1 if eagle3 else number("num_hidden_layers", 1), vocab_size=vocab,
        draft_vocab_size=number("draft_vocab_size", vocab) if eagle3 else vocab,
        feature_layers=feature_layers,
        rms_norm_eps=number("rms_norm_eps", 1e-6, float), hidden_act=str(raw.get("hidden_act") or "silu"),
        fc_bias="fc.bias" in tensors,
        attention_bias=any(name.endswith("self_attn.q_proj.bias") for name in tensors),
        norm_before_residual=bool(raw.get("norm_before_residual", False)), rope=rope)


def load_head(target: specframe.Target, spec: str) -> tuple[EagleHead, Path]:
    """The head `spec` names (see `resolve`), its weights in the target's dtype on its device."""
    directory = resolve(spec)
    if not (directory / CONFIG).is_file():
        raise ModelLoadError(f"eagle: no {CONFIG} in {directory}: an EAGLE head is a directory with "
                             f"{CONFIG} and {WEIGHTS}")
    raw = read_json(directory / CONFIG, "fix the file, or fetch the head again", ModelLoadError)
    if not isinstance(raw, dict):
        raise ModelLoadError(f"eagle: {directory / CONFIG} holds no JSON object")
    tensors = read_weights(directory)
    config = head_config(raw, tensors, target, str(directory))
    head = EagleHead(config)
    embed = tensors.pop("embed_tokens.weight", None)
    expected = tuple(target.model.get_input_embeddings().weight.shape)
    if embed is not None and tuple(embed.shape) != expected:
        raise EagleHeadMismatch(f"eagle: the head in {directory} holds an embedding of shape "
                                f"{tuple(embed.shape)}, the target '{target.name}' one of {expected}")
    eagle3 = config.form == "eagle3"
    if eagle3:
        tensors = {("midlayer." + name[len("layers.0."):] if name.startswith("layers.0.") else name): t
                   for name, t in tensors.items()}
        tensors.setdefault("t2d", head.t2d)  # unused when drafting; some checkpoints leave it out
        if not hasattr(head, "fc"):  # features of the last layer only: no projection (as vLLM loads it)
            tensors = {name: t for name, t in tensors.items() if not name.startswith("fc.")}
    own = {name: t for name, t in head.state_dict().items() if not name.startswith("rotary.")}
    missing = sorted(set(own) - set(tensors))
    unused = sorted(set(tensors) - set(own))
    shapes = [f"{n} {tuple(tensors[n].shape)} (expected {tuple(own[n].shape)})"
              for n in sorted(set(own) & set(tensors)) if tensors[n].shape != own[n].shape]
    if missing or unused or shapes:
        raise ModelLoadError(
            f"eagle: the weights in {directory} are not an {'EAGLE-3' if eagle3 else 'EAGLE'} head of its "
            f"config (missing: {missing[:4] or 'none'}; not used: {unused[:4] or 'none'}; "
            f"shapes: {shapes[:3] or 'none'})")
    dtype = next(target.model.parameters()).dtype
    head.load_state_dict({n: t.to(dtype) if t.is_floating_point() else t for n, t in tensors.items()})
    if config.form == "eagle3":
        check_vocab_map(head, directory)
    return head.to(target.device).eval().requires_grad_(False), directory


def check_vocab_map(head: EagleHead, directory: Path) -> None:
    """EAGLE-3's d2t must send the draft vocabulary to distinct target ids within the vocabulary."""
    ids = draft_token_ids(head)
    if int(ids.min()) < 0 or int(ids.max()) >= head.config.vocab_size or len(torch.unique(ids)) != len(ids):
        raise ModelLoadError(f"eagle: the d2t of the head in {directory} does not map its "
                             f"{len(ids)} draft tokens to distinct ids of the vocabulary "
                             f"({head.config.vocab_size})")


def draft_token_ids(head: EagleHead) -> torch.Tensor | None:
    """(Vd,) the target id of each draft-vocabulary row (EAGLE-3: i + d2t[i]); None: the whole vocabulary."""
    if head.config.form != "eagle3":
        return None
    return torch.arange(len(head.d2t), device=head.d2t.device) + head.d2t


def save_head(head: EagleHead, directory: str | Path, target: specframe.Target, extra: dict | None = None,
              dtype: torch.dtype = torch.float16) -> Path:
    """Write `head` as a checkpoint of its published layout (config.json + model.safetensors), so that the
    engines that load EAGLE heads load it too."""
    from safetensors.torch import save

    c = head.config
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLMEagle3" if c.form == "eagle3" else "LlamaForCausalLM"],
        "model_type": "llama", "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
        "num_hidden_layers": c.layers, "vocab_size": c.vocab_size, "rms_norm_eps": c.rms_norm_eps,
        "hidden_act": c.hidden_act, "bias": c.fc_bias, "tie_word_embeddings": False, **c.rope,
    }
    if c.form == "eagle3":
        config["draft_vocab_size"] = c.draft_vocab_size
        config["eagle_config"] = {"use_aux_hidden_state": bool(c.feature_layers),
                                  **({"eagle_aux_hidden_state_layer_ids": list(c.feature_layers)}
                                     if c.feature_layers else {})}
    config["specframe"] = {"target": target.name, **(extra or {})}
    tensors = {name: (t.detach().to(dtype) if t.is_floating_point() else t.detach()).cpu().contiguous()
               for name, t in head.state_dict().items() if not name.startswith("rotary.")}
    write_atomically(directory / WEIGHTS, save(tensors, metadata={"format": "pt"}))
    write_atomically(directory / CONFIG, json.dumps(config, indent=2) + "\n")
    return directory


def rope_of(target: specframe.Target) -> dict:
    """The target's rotary settings as a head's config.json states them."""
    config = target.config
    params = dict(getattr(config, "rope_parameters", None) or {})
    theta = params.pop("rope_theta", getattr(config, "rope_theta", 10000.0))
    rope = {"rope_theta": theta,
            "max_position_embeddings": int(getattr(config, "max_position_embeddings", 2048))}
    if params.get("rope_type", "default") != "default":
        rope["rope_scaling"] = params
    return rope


def config_for(target: specframe.Target, form: str = "eagle", feature_layers: tuple[int, ...] | None = None,
               draft_vocab_size: int | None = None, layers: int = 1) -> HeadConfig:
    """A head of the target's own sizes (one decoder layer like its own), for training or tests. EAGLE-3
    reads `feature_layers` (default: the low, middle and high layers 2, L // 2, L - 3, as published)."""
    c = target.config
    hidden = int(target.model.get_input_embeddings().weight.shape[1])
    vocab = int(target.model.get_input_embeddings().weight.shape[0])
    heads = int(getattr(c, "num_attention_heads", 0) or max(hidden // 64, 1))
    count = int(getattr(c, "num_hidden_layers", 0) or 0)
    if form == "eagle3" and feature_layers is None:
        feature_layers = tuple(sorted((min(2, count), count // 2, max(count - 3, 0))))  # in layer order
    return HeadConfig(
        form=form, hidden_size=hidden, num_heads=heads,
        num_kv_heads=int(getattr(c, "num_key_value_heads", heads) or heads),
        head_dim=int(getattr(c, "head_dim", None) or hidden // heads),
        intermediate_size=int(getattr(c, "intermediate_size", None) or 4 * hidden), layers=layers,
        vocab_size=vocab, draft_vocab_size=int(draft_vocab_size or vocab) if form == "eagle3" else vocab,
        feature_layers=tuple(feature_layers) if form == "eagle3" and feature_layers else None,
        rms_norm_eps=float(getattr(c, "rms_norm_eps", 1e-6) or 1e-6),
        hidden_act=str(getattr(c, "hidden_act", "silu") or "silu"), rope=rope_of(target))
