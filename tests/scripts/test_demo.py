"""`make demo` is what the README says it is: the README's "Use" section quotes the Makefile's demo command
word for word, and the demo times one thread by CPU time, as the README advises on a busy machine."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUOTED_BY = "# what `make demo` runs"


def makefile_demo() -> str:
    """The shell command of the Makefile's `DEMO` variable, as make hands it to the shell (`$$` is `$`)."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(r"^DEMO := (.+)$", text, re.MULTILINE)
    assert match, "the Makefile has no `DEMO := ...` line"
    recipe = re.search(r"^demo:.*\n\t(.+)$", text, re.MULTILINE)
    assert recipe and recipe.group(1).endswith("$(DEMO)"), "`make demo` does not run $(DEMO)"
    return match.group(1).replace("$$", "$")


def readme_demo() -> str:
    """The command on the line after the README's `# what make demo runs` comment."""
    lines = (ROOT / "README.md").read_text().splitlines()
    marks = [i for i, line in enumerate(lines) if line.startswith(QUOTED_BY)]
    assert len(marks) == 1, "the README should quote the demo command once"
    return lines[marks[0] + 1]


def test_the_readme_quotes_the_command_make_demo_runs():
    assert readme_demo() == makefile_demo()


def test_the_demo_times_one_thread_by_cpu_time_and_its_prompt_file_exists():
    words = shlex.split(makefile_demo().replace('"$(cat examples/demo-prompt.txt)"', "PROMPT"))
    assert words[:3] == ["specframe", "generate", "PROMPT"]
    options = dict(zip(words[3::2], words[4::2]))
    assert options["--threads"] == "1" and options["--clock"] == "cpu"
    assert "--compare" in words
    prompt = (ROOT / "examples" / "demo-prompt.txt").read_text()
    assert prompt.startswith("class ")
