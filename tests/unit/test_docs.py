"""The docs say what the committed evidence says: README.md and docs/*.md hold tables that
benchmarks/make_docs.py prints from benchmarks/results/*.json and the launcher's flags, and
these tests fail when a page or figure differs from what it prints now, when the README
outgrows a user's page, or when a page points at a file the repository does not have.

Run: PYTHONPATH=$PWD .venv/bin/python -m pytest -q -p no:xdist -o addopts= tests/unit/test_docs.py
(about 15 s: the flag tables import sglang). Fix a failure with
PYTHONPATH=$PWD .venv/bin/python benchmarks/make_docs.py, or by mending the page.
"""

import os
import re
import subprocess

from sglang_zipage.harness import docs_pages

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = docs_pages.pages(ROOT)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CITED = re.compile(r"`([\w./-]+\.(?:md|json|py|sh|png|svg|txt))`")


def _read(page):
    with open(os.path.join(ROOT, page)) as f:
        return f.read()


def _anchors(page):
    """GitHub's heading anchors of a markdown page."""
    heads = re.findall(r"^#+ (.+)$", _read(page), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_generated_tables_and_figures_match_what_make_docs_prints():
    assert docs_pages.differences(ROOT) == [], (
        "run: PYTHONPATH=$PWD .venv/bin/python benchmarks/make_docs.py")


def test_every_page_with_generated_blocks_is_checked():
    names = {m.group(2) for page in PAGES for m in docs_pages.BLOCK.finditer(_read(page))}
    assert names <= set(docs_pages.BLOCKS), names - set(docs_pages.BLOCKS)
    assert {"readme-results", "results-steady", "flags-zipage"} <= names


def test_readme_is_a_users_page_of_at_most_250_lines():
    assert len(_read("README.md").splitlines()) <= 250


def test_relative_links_point_to_existing_files_and_headings():
    broken = []
    for page in PAGES:
        for target in LINK.findall(_read(page)):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path \
                else os.path.join(ROOT, page)
            if not os.path.exists(full):
                broken.append(f"{page}: {target}")
            elif anchor and full.endswith(".md") and \
                    anchor not in _anchors(os.path.relpath(full, ROOT)):
                broken.append(f"{page}: {target} (no such heading)")
    assert not broken, broken


def test_files_named_in_the_docs_are_in_the_repository():
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    tracked += list(docs_pages.FIGURES)
    missing = []
    for page in PAGES:
        for name in set(CITED.findall(_read(page))):
            if not any(t == name or t.endswith("/" + name) for t in tracked):
                missing.append(f"{page}: {name}")
    assert not missing, missing
