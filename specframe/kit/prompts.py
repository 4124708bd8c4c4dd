"""The prompt suites `specframe bench` runs (HumanEval, Spec-Bench, MT-Bench or a JSONL file), for a
plugin that trains or measures on the same prompts, such as hybrid's distillation data.

- `load_suite(suite, limit)` reads a suite (a name of `SUITES` or a Spec-Bench style JSONL path) as
  `BenchPrompt`s, at most `limit` per category; a malformed file is refused line by line.
- `encode_turn(tokenizer, prompt, turn, answers)` tokenises one turn as the benchmark does: raw code for
  HumanEval, else the conversation so far in the model's chat template.
- `chat_ids(tokenizer, messages, fix)` puts messages in the chat template; a template that fails is a
  `PromptError` naming it, with `fix` (what to do instead).

Imports neither torch nor transformers: a plugin may import it at the top of any module.
"""

from specframe.support.prompt_suites import SUITES, BenchPrompt, chat_ids, encode_turn, load_suite

__all__ = ["SUITES", "BenchPrompt", "chat_ids", "encode_turn", "load_suite"]
