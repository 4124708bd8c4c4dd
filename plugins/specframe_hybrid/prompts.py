"""Chat prompts whose answers by the teacher become distillation data: instructions of the kinds a chat model
is asked (writing, explaining, advice, code, maths, rewriting), written for this project and disjoint from
every benchmark (HumanEval, Spec-Bench, MT-Bench), so quality measured on those stays held out."""

from __future__ import annotations

import itertools
import random

TEMPLATES = (
    "Write a short story about {subject}.",
    "Explain {subject} to a curious twelve-year-old.",
    "Give me five practical tips about {subject}.",
    "What are the main advantages and disadvantages of {subject}?",
    "Write a friendly email to a colleague about {subject}.",
    "Write a Python function related to {subject}, with a docstring and an example.",
    "Summarise the history of {subject} in a few paragraphs.",
    "Write a poem about {subject}.",
    "Describe a typical day of someone who works with {subject}.",
    "What questions should a beginner ask about {subject}? Answer three of them.",
    "Write a product description for something connected with {subject}.",
    "Create a short quiz with answers about {subject}.",
    "Compare {subject} with a related idea and explain the difference.",
    "Write the outline of a presentation about {subject}.",
    "List common mistakes people make with {subject} and how to avoid them.",
    "Write a dialogue between two friends discussing {subject}.",
)
SUBJECTS = (
    "gardening in small apartments", "the water cycle", "learning a second language", "public libraries",
    "bicycle maintenance", "volcanoes", "saving money on groceries", "sorting algorithms",
    "the invention of the printing press", "honey bees", "remote work", "sourdough bread",
    "electric cars", "the solar system", "chess openings", "recycling plastics", "time zones",
    "the human heart", "writing unit tests", "mountain hiking safety", "coral reefs", "jazz music",
    "spreadsheets", "sleep and memory", "ancient Roman roads", "password security", "weather forecasts",
    "composting", "the metric system", "birdwatching", "version control with git", "lighthouses",
)


def distillation_prompts(count: int, seed: int = 0) -> list[str]:
    """`count` distinct prompts (templates x subjects, in a fixed shuffled order)."""
    pairs = list(itertools.product(TEMPLATES, SUBJECTS))
    random.Random(seed).shuffle(pairs)
    if count > len(pairs):
        raise ValueError(f"at most {len(pairs)} distillation prompts exist (asked for {count})")
    return [template.format(subject=subject) for template, subject in pairs[:count]]
