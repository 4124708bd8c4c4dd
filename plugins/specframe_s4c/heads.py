"""S4C draft heads: `h = Linear(concat[e, f])`, one decoder layer of the target's own architecture, a norm.

Head k maps (token embedding e, feature f) to a predicted target feature, which the target's own (frozen,
shared) LM head turns into a draft distribution. Head 1 starts from the target's real feature; head k + 1
starts from head k's predicted feature (autoregressive between heads). The heads see only that one
feature, never the context, so each input is a sequence of length one: the layer's attention reduces to
its value/output projections, and drafting needs no draft KV cache (S4C's feature reuse).

Checkpoints are safetensors files whose metadata names the target they were trained for; loading them
for another target raises `S4CHeadsMismatch` with what differs.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

import specframe
from specframe import ModelLoadError
from specframe.kit.files import write_atomically

FORMAT = "specframe-s4c-heads/1"


class S4CHeadsMismatch(ModelLoadError):
    """Heads were trained for a different target model."""


def target_parts(target: specframe.Target) -> tuple[nn.Module, nn.Module, nn.Module, nn.ModuleList]:
    """(embedding, final norm, LM head, decoder layers) of a Hugging Face causal LM."""
    base = target.model.base_model
    return target.model.get_input_embeddings(), base.norm, target.model.get_output_embeddings(), base.layers


def fingerprint(target: specframe.Target) -> dict[str, str]:
    """What identifies the target a set of heads belongs to: sizes, architecture and an embedding checksum."""
    embed = target.model.get_input_embeddings().weight
    # stable across float32 reloads of the same weights
    checksum = float(embed[:256].detach().double().abs().sum())
    return {"architecture": type(target.model).__name__, "hidden_size": str(embed.shape[1]),
            "vocab_size": str(embed.shape[0]), "embed_checksum": f"{checksum:.4f}"}


class S4CHead(nn.Module):
    """One head: fc over [e, f] (2H -> H), a decoder layer of the target's class, a final norm."""

    def __init__(self, layer: nn.Module, norm: nn.Module, hidden: int):
        super().__init__()
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.layer = layer
        self.norm = norm

    def forward(self, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """(N, H) token embeddings and (N, H) input features -> (N, H) predicted next features."""
        x = self.fc(torch.cat([embeds, features], dim=-1))[:, None]  # (N, 1, H)
        head_dim = self.layer.self_attn.head_dim
        cos = torch.ones(x.shape[0], 1, head_dim, dtype=x.dtype, device=x.device)  # rotary at position 0
        sin = torch.zeros_like(cos)
        x = self.layer(x, position_embeddings=(cos, sin))  # (N, 1, H)
        return self.norm(x[:, 0])  # (N, H), comparable with the target's post-norm feature


class S4CHeads(nn.Module):
    """`num_heads` heads for one target. The target's embedding and LM head are used, never copied."""

    def __init__(self, target: specframe.Target, num_heads: int = 3, vocab_ids: torch.Tensor | None = None):
        super().__init__()
        embed, norm, _, layers = target_parts(target)
        hidden = embed.weight.shape[1]
        # The last attention layer: the target's own architecture and a good starting point. A head reads
        # one position, so it needs attention (its value/output projections), not a hybrid's Mamba mixer.
        attention = [layer for layer in layers if getattr(layer, "self_attn", None) is not None]
        last = attention[-1] if attention else None
        if last is None:
            raise ModelLoadError(f"s4c: {target.name} has no attention layer; S4C heads are built from one")
        heads = []
        for k in range(num_heads):
            layer = copy.deepcopy(last)
            layer.self_attn.layer_idx = k
            head = S4CHead(layer, copy.deepcopy(norm), hidden)
            with torch.no_grad():  # start as "feature in, feature out": identity on f, small weights on e
                head.fc.weight.normal_(0.0, 0.02)
                head.fc.weight[:, hidden:] += torch.eye(hidden)
                head.fc.bias.zero_()
            heads.append(head)
        self.heads = nn.ModuleList(heads)
        # Draft vocabulary: the token ids the heads may propose (a frequency-ranked subset keeps the LM-head
        # product small, as in FR-Spec); all of them when None.
        vocab = torch.arange(embed.weight.shape[0]) if vocab_ids is None else vocab_ids.long()
        self.register_buffer("vocab_ids", vocab, persistent=True)  # (Vd,)
        self.meta = fingerprint(target) | {"model": target.name, "num_heads": str(num_heads)}
        self.requires_grad_(True)

    def __len__(self) -> int:
        return len(self.heads)

    def forward(self, k: int, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Head k (0-based): (N, H), (N, H) -> (N, H)."""
        return self.heads[k](embeds, features)

    # --- checkpoints -------------------------------------------------------------------------------

    def save(self, path: str | Path, extra: dict[str, str] | None = None, dtype=torch.float16) -> None:
        """Write the heads as safetensors (fp16 by default) with the target's fingerprint as metadata,
        atomically (a full disk leaves the previous file) and with the modes of the user's umask."""
        from safetensors.torch import save

        tensors = {name: (t.detach().to(dtype) if t.is_floating_point() else t.detach()).cpu().contiguous()
                   for name, t in self.state_dict().items()}
        meta = {"format": FORMAT, **self.meta, **(extra or {})}
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_atomically(Path(path), save(tensors, metadata=meta))

    @classmethod
    def load(cls, target: specframe.Target, path: str | Path) -> S4CHeads:
        """Heads from `path`, checked against `target`; weights are cast to the target's dtype."""
        path = Path(path)
        meta, tensors = read_heads_file(path)
        check_fingerprint(target, meta, path)
        heads = cls(target, num_heads=int(meta["num_heads"]), vocab_ids=tensors["vocab_ids"])
        dtype = next(target.model.parameters()).dtype
        try:
            heads.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v
                                   for k, v in tensors.items()})
        except RuntimeError as err:  # names or shapes that are not this target's heads'
            raise bad_heads_file(path, "holds weights of other names or shapes than this target's heads ("
                                 + " ".join(str(err).split())[:300] + ")") from None
        heads.meta = {k: v for k, v in meta.items() if k != "format"}
        return heads.to(target.device).eval().requires_grad_(False)


def read_heads_file(path: str | Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """(metadata, tensors) of an S4C heads file, unchecked against any target."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"s4c: no heads file at {path}; train one with `specframe train s4c`")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:  # a pickle, a truncated file, ...
        raise bad_heads_file(path, f"is not a readable safetensors file ({' '.join(str(err).split())})"
                             ) from None
    if meta.get("format") != FORMAT:
        raise ModelLoadError(f"s4c: {path} is not an S4C heads file (format {meta.get('format')!r})")
    check_heads_file(path, meta, tensors)
    return meta, tensors


MAX_HEADS = 64  # far more heads than drafting uses (each drafts one level deeper)


def bad_heads_file(path: Path, problem: str) -> ModelLoadError:
    return ModelLoadError(f"s4c: the heads file {path} {problem}; train heads with `specframe train s4c "
                          "--model MODEL` and pass its RUN/heads.safetensors, or another file it wrote")


def check_heads_file(path: Path, meta: dict[str, str], tensors: dict[str, torch.Tensor]) -> None:
    """Refuse a heads file whose `num_heads` is not a count its tensors hold, or whose `vocab_ids` is not
    a 1-D list of distinct token ids within its `vocab_size`, naming what is wrong."""
    count = meta.get("num_heads", "")
    if not (count.isascii() and count.isdigit() and 1 <= int(count) <= MAX_HEADS):
        raise bad_heads_file(path, f"names num_heads {count!r}, not a count from 1 to {MAX_HEADS}")
    stored = {name.split(".")[1] for name in tensors if name.startswith("heads.")}
    if stored != {str(k) for k in range(int(count))}:
        raise bad_heads_file(path, f"says num_heads {count} but holds the weights of heads "
                             f"{sorted(stored, key=lambda k: (len(k), k)) or 'none'}")
    vocab = tensors.get("vocab_ids")
    size = meta.get("vocab_size", "")
    if vocab is None:
        raise bad_heads_file(path, "has no vocab_ids (the draft vocabulary's token ids)")
    if (vocab.dim() != 1 or vocab.numel() == 0 or vocab.dtype.is_floating_point or vocab.dtype == torch.bool
            or vocab.is_complex() or not (size.isascii() and size.isdigit())
            or int(vocab.min()) < 0 or int(vocab.max()) >= int(size)
            or len(torch.unique(vocab)) != vocab.numel()):
        raise bad_heads_file(path, f"holds vocab_ids {vocab.dtype} of shape {tuple(vocab.shape)}, not "
                             f"distinct token ids below its vocab_size {size!r}")


# A Llama decoder layer's SwiGLU MLP as a GraniteMoeHybrid layer names it (the layout
# plugins/specframe_hybrid/convert.py writes; plugins do not import each other, so it is repeated here):
# input_linear = cat[gate_proj, up_proj] along the output rows, output_linear = down_proj.
LLAMA_MLP = ".mlp.gate_proj.weight", ".mlp.up_proj.weight", ".mlp.down_proj.weight"
HYBRID_MLP = ".shared_mlp.input_linear.weight", ".shared_mlp.output_linear.weight"


def map_head_weights(source: dict[str, torch.Tensor], wanted: dict[str, torch.Tensor], path: Path
                     ) -> dict[str, torch.Tensor]:
    """`source` (head weights of heads trained for another target) under the names and shapes of `wanted`
    (this target's heads): names that match are taken as they are, a Llama MLP becomes a GraniteMoeHybrid
    `shared_mlp`. Raise `S4CHeadsMismatch` listing what cannot be mapped."""
    mapped = dict(source)
    gate, up, down = LLAMA_MLP
    joined, out = HYBRID_MLP
    for name in [n for n in source if n.endswith(gate)]:
        prefix = name[:-len(gate)]
        if prefix + up in source and prefix + down in source and prefix + joined in wanted:
            mapped[prefix + joined] = torch.cat([mapped.pop(prefix + gate), mapped.pop(prefix + up)])
            mapped[prefix + out] = mapped.pop(prefix + down)
    missing = sorted(set(wanted) - set(mapped))
    unused = sorted(set(mapped) - set(wanted))
    shapes = [f"{n}: {tuple(mapped[n].shape)} vs {tuple(wanted[n].shape)}"
              for n in sorted(set(wanted) & set(mapped)) if mapped[n].shape != wanted[n].shape]
    if missing or unused or shapes:
        raise S4CHeadsMismatch(
            f"s4c: the heads in {path} do not map onto this target's (missing: {missing[:4] or 'none'}; "
            f"not used: {unused[:4] or 'none'}; shapes: {shapes[:4] or 'none'})")
    return mapped


def check_fingerprint(target: specframe.Target, meta: dict[str, str], path: Path) -> None:
    """Raise `S4CHeadsMismatch` naming every field where the heads' target differs from `target`."""
    mine = fingerprint(target)
    diffs = [f"{k}: heads {meta.get(k)!r} vs target {v!r}" for k, v in mine.items() if meta.get(k) != v]
    if diffs:
        raise S4CHeadsMismatch(
            f"s4c: heads {path} were trained for model '{meta.get('model', '?')}', not for '{target.name}' "
            f"({'; '.join(diffs)}). Train heads for this target with "
            f"`specframe train s4c --model {target.name} --data ...` and pass them as s4c(heads=PATH).")

