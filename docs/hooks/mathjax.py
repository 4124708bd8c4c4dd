"""mkdocs hook: serve MathJax with the site, so that the math renders offline.

MathJax comes from the `django-static-mathjax` package of the `docs` extra (only its files are used, not
Django): after the build, the parts the pages load are copied to `javascripts/mathjax/` of the site, with
the TeX extensions that MathJax loads on demand and its CommonHTML fonts beside the script, where MathJax
looks for them. Nothing third-party is committed to the repository, and the site names no CDN.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from mkdocs.exceptions import PluginError

TARGET = "javascripts/mathjax"  # under the site; mkdocs.yml's extra_javascript names TARGET/SCRIPT
SCRIPT = "tex-mml-chtml.js"
PARTS = (SCRIPT, "input", "output/chtml", "ui", "a11y")  # the script, what it loads on demand, its fonts


def mathjax_home() -> Path:
    """The `es5` folder of the installed MathJax, or a `PluginError` saying how to install it."""
    try:
        import mathjax
    except ImportError:
        mathjax = None
    home = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5" if mathjax else None
    if home is None or not (home / SCRIPT).is_file():
        raise PluginError("docs/hooks/mathjax.py: MathJax is not installed, so the site's math would not "
                          "render; install the docs extra: pip install -e '.[docs]' (django-static-mathjax)")
    return home


def on_post_build(config, **kwargs) -> None:
    home, site = mathjax_home(), Path(config["site_dir"]) / TARGET
    for part in PARTS:
        source, target = home / part, site / part
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
        else:
            shutil.copy2(source, target)
