"""How close a hybrid stays to its teacher on held-out text: greedy next-token agreement (the fraction of
positions where both pick the same argmax, which bounds what a drafter built on the teacher's habits can
expect) and perplexity, per suite, with the teacher's own perplexity as the reference row."""

from __future__ import annotations

import math

import torch

from specframe.kit.progress import bar
from specframe_hybrid.data import held_out_texts


@torch.inference_mode()
def _next_token_stats(model: torch.nn.Module, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(argmax prediction, log-probability of the actual next token) at every position but the last."""
    tokens = torch.tensor([ids])  # (1, T)
    logits = model(tokens, use_cache=False).logits[0, :-1].float()  # (T-1, V)
    logprobs = torch.log_softmax(logits, dim=-1)
    return logits.argmax(-1), logprobs.gather(1, tokens[0, 1:, None])[:, 0]


def measure(teacher_name: str, hybrids: list[str], *, humaneval: int = 20,
            per_category: int = 5) -> list[dict]:
    """One row per model (the teacher first) and suite: agreement with the teacher, perplexity, tokens."""
    import specframe

    teacher = specframe.load_target(teacher_name, device="cpu", dtype="float32")
    models = {}  # every model loaded and checked before any is measured: a wrong name fails in seconds
    for name in hybrids:
        models[name] = specframe.load_target(name, device="cpu", dtype="float32")
        if models[name].tokenizer.get_vocab() != teacher.tokenizer.get_vocab():
            raise specframe.ConfigurationError(f"model '{name}' has another tokenizer than '{teacher_name}'")
    texts = held_out_texts(teacher.tokenizer, humaneval=humaneval, per_category=per_category)
    reference = {suite: [_next_token_stats(teacher.model, ids) for ids in bar(seqs, desc=f"teacher {suite}")]
                 for suite, seqs in texts.items()}
    rows = [_row(teacher_name, suite, ref, ref) for suite, ref in reference.items()]
    for name, model in models.items():
        for suite, seqs in texts.items():
            stats = [_next_token_stats(model.model, ids) for ids in bar(seqs, desc=f"{name} {suite}")]
            rows.append(_row(name, suite, stats, reference[suite]))
    return rows


def _row(name: str, suite: str, stats, reference) -> dict:
    agree = sum(int((s[0] == r[0]).sum()) for s, r in zip(stats, reference))
    positions = sum(len(s[0]) for s in stats)
    nll = -sum(float(s[1].sum()) for s in stats) / positions
    return {"model": name, "suite": suite, "agreement": agree / positions, "perplexity": math.exp(nll),
            "positions": positions}


def table(rows: list[dict]) -> str:
    """The rows as a markdown table."""
    lines = ["| model | suite | greedy agreement with teacher | perplexity | positions |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['suite']} | {r['agreement']:.3f} | {r['perplexity']:.2f} "
              f"| {r['positions']} |" for r in rows]
    return "\n".join(lines)
