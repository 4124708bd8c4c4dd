"""mkdocs hook: replace `<!-- specframe-cli -->` with the reference of every `specframe` command.

The text is generated from the click command tree of the typer app at build time, plugin sub-commands
included (through `specframe.cli.build_app`), so the page can never drift from the code.
"""

from __future__ import annotations

MARKER = "<!-- specframe-cli -->"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, cli_reference())


def cli_reference() -> str:
    import typer.main

    from specframe.cli import build_app

    root = typer.main.get_command(build_app())
    return "\n".join(_command(root, ["specframe"]))


def _command(cmd, path: list[str]) -> list[str]:
    """Markdown for `cmd` and its sub-commands. Duck-typed: typer may vendor its own copy of click."""
    level = "#" * min(len(path) + 1, 6)
    lines = [f"{level} `{' '.join(path)}`", ""]
    if cmd.help:
        lines += [_clean(cmd.help), ""]
    params = [p for p in cmd.params if p.name != "help"]
    arguments = [p for p in params if p.param_type_name == "argument"]
    options = [p for p in params if p.param_type_name == "option"]
    if arguments or options:
        ctx = cmd.context_class(cmd, info_name=path[-1])
        usage = " ".join([*path, *(a.name.upper() for a in arguments), "[OPTIONS]" if options else ""])
        lines += ["```text", usage.strip(), "```", ""]
        lines += ["| argument or option | what |", "|---|---|"]
        for a in arguments:
            lines.append(f"| `{a.name.upper()}` | {_cell(getattr(a, 'help', None) or '')} |")
        for o in options:
            names, what = o.get_help_record(ctx) or (", ".join(o.opts), "")
            lines.append(f"| `{names}` | {_cell(what)} |")
        lines.append("")
    if hasattr(cmd, "commands"):
        for name in sorted(cmd.commands):
            lines += _command(cmd.commands[name], [*path, name])
    return lines


def _cell(text: str) -> str:
    """Text for one table cell: pipes and brackets escaped (`[@BUDGET]` is no link), one line."""
    text = _clean(text).replace("\n", " ")
    for char in "|[]":
        text = text.replace(char, "\\" + char)
    return text


def _clean(text: str) -> str:
    import inspect

    return inspect.cleandoc(text).replace("\b\n", "")
