#!/usr/bin/env python3
"""Print the docs' generated tables and figures from the committed results.

Rewrites the blocks between ``<!-- generated:NAME begin -->`` and ``<!-- generated:NAME end -->``
in README.md and docs/*.md, and the SVG figures under docs/figures/, from
benchmarks/results/*.json and the launcher's flags (sglang_zipage/harness/docs_pages.py says
which block comes from where). ``--check`` writes nothing and exits 1 naming the files that
differ from what the script prints now (tests/unit/test_docs.py runs the same check).

  PYTHONPATH=$PWD .venv/bin/python benchmarks/make_docs.py           # rewrite
  PYTHONPATH=$PWD .venv/bin/python benchmarks/make_docs.py --check   # compare only

About 10 s (the flag tables import sglang).
"""

from __future__ import annotations

import argparse
import os
import sys

from sglang_zipage.harness import docs_pages

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 on differences")
    args = ap.parse_args()
    if args.check:
        diff = docs_pages.differences(ROOT)
        for path in diff:
            print(f"differs from what benchmarks/make_docs.py prints now: {path}")
        return 1 if diff else 0
    for path in docs_pages.write(ROOT):
        print(f"rewrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
