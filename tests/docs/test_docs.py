"""The documentation: docstring examples run (doctests of every module that has one), every public class and
function has a docstring, the README stays short and links to pages that exist, the rendered tutorials are
the notebooks' cells, and (slow) the strict site build gives every public name an entry."""

from __future__ import annotations

import ast
import doctest
import importlib
import json
import re
from pathlib import Path

import pytest
import torch
from helpers.paths import REPO

import mtlab

ROOT = REPO
PACKAGE = ROOT / "mtlab"
# Packages whose __all__ the API pages list name by name (scripts/mkdocs_hooks.py NAMED_PACKAGES).
NAMED = ("mtlab", "mtlab.models", "mtlab.data", "mtlab.separation", "mtlab.ui", "mtlab.nabu")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if "data_samples" not in p.parts and "recipes" not in p.parts)
WITH_EXAMPLES = [module_name(p) for p in SOURCES if ">>> " in p.read_text()]


def test_examples_are_collected() -> None:
    assert len(WITH_EXAMPLES) >= 20, WITH_EXAMPLES


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_docstring_examples_run(name: str, one_thread: None) -> None:
    """Each module's docstring examples, as doctest runs them; those that need data or a kernel are marked
    ``# doctest: +SKIP`` in the docstring."""
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    for test in finder.find(module, name, globs={"torch": torch, "mtlab": mtlab, **vars(module)}):
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)


def public_definitions(path: Path) -> list[tuple[str, ast.AST]]:
    """Module-level public classes and functions of one file."""
    tree = ast.parse(path.read_text())
    out: list[tuple[str, ast.AST]] = []
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            out.append((node.name, node))
    return out


def test_every_public_class_and_function_has_a_docstring() -> None:
    missing = [f"{module_name(p)}.{name}" for p in SOURCES for name, node in public_definitions(p)
               if not ast.get_docstring(node)]
    assert not missing, "write a short docstring for: " + ", ".join(missing)


def test_every_public_method_of_the_top_level_names_has_a_docstring() -> None:
    import inspect

    missing = []
    for name in mtlab.__all__:
        obj = getattr(mtlab, name)
        if not inspect.isclass(obj):
            continue
        for attr, value in vars(obj).items():
            fn = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
            if not attr.startswith("_") and inspect.isfunction(fn) and not fn.__doc__:
                missing.append(f"mtlab.{name}.{attr}")
    assert not missing, "write a short docstring for: " + ", ".join(missing)


def test_readme_is_short_and_its_links_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 15_000, f"README.md is {len(readme.encode())} bytes; move detail into docs/"
    links = re.findall(r"\]\(((?:docs/|CHANGELOG)[^)#]*)", readme)
    assert len(links) >= 10 and "docs/api/index.md" in links
    assert all((ROOT / link).exists() for link in links), [link for link in links if not (ROOT / link).exists()]
    assert "python -m mtlab demo" in readme and "bash .ci/run" in readme


WITH_FIGURES = ("01_quickstart", "02_accumulation_explained", "03_multitask_linkedsets", "06_task_combination")


def test_rendered_tutorials_are_the_notebooks() -> None:
    """docs/tutorials/ holds executed copies of notebooks/: same cells, with outputs. After editing a notebook,
    run ``python scripts/render_tutorials.py NAME``."""
    def cells(path: Path) -> list[dict]:
        return json.loads(path.read_text())["cells"]  # plain JSON: nbformat's schema check takes seconds

    def text(cell: dict) -> str:
        return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]

    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert notebooks
    for path in notebooks:
        copy = ROOT / "docs" / "tutorials" / path.name
        assert copy.exists(), f"{copy} is missing: python scripts/render_tutorials.py {path.stem[:2]}"
        src, out = cells(path), cells(copy)
        assert [(c["cell_type"], text(c)) for c in src] == [(c["cell_type"], text(c)) for c in out], \
            f"{copy.name} differs from the notebook: python scripts/render_tutorials.py {path.stem[:2]}"
        code = [c for c in out if c["cell_type"] == "code" and text(c).strip()]
        assert all(c["execution_count"] for c in code), f"{copy.name} has cells that did not run"
        assert not [o for c in code for o in c["outputs"] if o.get("output_type") == "error"], f"{copy.name}: errors"
        if path.stem in WITH_FIGURES:
            assert any("image/png" in o.get("data", {}) for c in code for o in c["outputs"]), f"{copy.name}: no figure"


@pytest.mark.slow
def test_the_site_builds_strictly_with_an_entry_for_every_public_name() -> None:
    from helpers.docs_site import built_site

    site = built_site()
    for pkg in NAMED:
        module = importlib.import_module(pkg)
        page = "mtlab" if pkg == "mtlab" else pkg.split(".")[1]
        html = (site / "api" / page / "index.html").read_text()
        missing = [n for n in module.__all__ if f'id="{pkg}.{n}"' not in html]
        assert not missing, f"api/{page}: no element id for {missing}"
    html = (site / "api" / "mtlab" / "index.html").read_text()
    assert 'id="mtlab.core.trainer.Trainer.process_minibatch"' in html  # members are documented too
    assert (site / "tutorials" / "01_quickstart" / "index.html").exists()


# ------------------------------------------------------------------ the site loads nothing from another host
# What a browser fetches by itself when it opens a page: a tag's src/srcset/poster/data, any <link> (stylesheet,
# preconnect, icon, ...), and in inline scripts and styles an import, url() or @import, or a quoted URL string.
# Links a reader clicks (<a href>) are not fetched and may point anywhere.
FETCHED_ATTRS = {"src", "srcset", "poster", "data", "background"}
QUOTED_URL = re.compile(r"""(?:url\(\s*|@import\s+|["'`])((?:https?:)?//[A-Za-z0-9.-]+)""")
BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
NAMESPACES = ("//www.w3.org",)  # XML namespace names (SVG in data: URLs, createElementNS): never fetched


def external_references(html: str) -> list[str]:
    """The hosts (with the tag or context) a page would load something from, besides its own."""
    from html.parser import HTMLParser
    from urllib.parse import urlsplit

    found: list[str] = []

    def external(url: str) -> bool:
        url = url.strip()
        return url.startswith("//") or urlsplit(url).scheme in ("http", "https", "ftp", "ws", "wss")

    class Scan(HTMLParser):
        inline: str | None = None

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            for name, value in attrs:
                urls = [u.split()[0] for u in (value or "").split(",") if u.strip()] if name == "srcset" else [value or ""]
                if (name in FETCHED_ATTRS or (tag == "link" and name == "href")) and any(external(u) for u in urls):
                    found.append(f"<{tag} {name}={value}>")
                if name == "style" and value:
                    found.extend(f"<{tag} style>: {m}" for m in QUOTED_URL.findall(value) if not m.endswith(NAMESPACES))
            self.inline = tag if tag in ("script", "style") else None

        def handle_endtag(self, tag: str) -> None:
            self.inline = None

        def handle_data(self, data: str) -> None:
            if self.inline:
                code = BLOCK_COMMENT.sub("", data)
                found.extend(f"<{self.inline}>: {m}" for m in QUOTED_URL.findall(code) if not m.endswith(NAMESPACES))

    Scan(convert_charrefs=True).feed(html)
    return found


def test_external_references_are_found() -> None:
    """The scan sees what the theme's fonts, a CDN script, a stylesheet and an inline import would load, and
    leaves links, namespaces and comments alone."""
    page = ('<link rel="preconnect" href="https://fonts.gstatic.com" crossorigin>'
            '<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">'
            '<script src="https://cdn.jsdelivr.net/npm/x.js"></script><img srcset="a.png 1x, //img.example/b.png 2x">'
            '<script type="module">/* @see https://developer.mozilla.org */'
            ' const m = await import("https://cdnjs.cloudflare.com/m.mjs");</script>'
            '<style>@import "https://fonts.example/f.css"; p { background: url(//img.example/x.png) }</style>'
            '<a href="https://squidfunk.github.io/mkdocs-material/">Material</a><svg xmlns="http://www.w3.org/2000/svg">'
            "<style>.i { mask-image: url('data:image/svg+xml;utf8,<svg xmlns=\"http://www.w3.org/2000/svg\"/>') }</style>"
            '<link rel="stylesheet" href="../assets/main.css"><script src="../assets/bundle.js"></script>')
    hosts = [re.search(r"//([A-Za-z0-9.-]+)", ref).group(1) for ref in external_references(page)]
    assert hosts == ["fonts.gstatic.com", "fonts.googleapis.com", "cdn.jsdelivr.net", "img.example",
                     "cdnjs.cloudflare.com", "fonts.example", "img.example"], hosts


@pytest.mark.slow
def test_no_page_of_the_site_loads_anything_from_another_host() -> None:
    """Offline or behind a firewall the site looks the same: no web font, script, stylesheet or image comes from
    another host (mkdocs.yml: ``theme.font: false``; scripts/mkdocs_hooks.py drops nbconvert's Mermaid loader)."""
    from helpers.docs_site import built_site

    site = built_site()
    pages = sorted(site.rglob("*.html"))
    assert len(pages) >= 20
    found = {str(p.relative_to(site)): refs for p in pages if (refs := external_references(p.read_text()))}
    for css in site.rglob("*.css"):
        refs = [m for m in QUOTED_URL.findall(BLOCK_COMMENT.sub("", css.read_text())) if not m.endswith(NAMESPACES)]
        if refs:
            found[str(css.relative_to(site))] = refs
    assert not found, f"pages that load from another host: {found}"
