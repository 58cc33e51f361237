"""Which generated block goes where, and the check that nothing drifted.

A page (README.md, docs/*.md) is hand-written markdown with generated blocks between

    <!-- generated:NAME begin -->
    ...
    <!-- generated:NAME end -->

``BLOCKS[NAME]`` prints a block's content from the committed result files (or the
launcher's flags); ``FIGURES`` are whole generated files. ``expected()`` is every generated
file as the builders print it now, ``differences()`` the files that differ from it on disk,
``write()`` rewrites them. ``benchmarks/make_docs.py`` is the command line;
``tests/unit/test_docs.py`` fails on any difference.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Callable, Dict, List, Optional

from sglang_zipage.harness import docs_cpu as cpu
from sglang_zipage.harness import docs_evidence as ev
from sglang_zipage.harness import docs_figures as fig
from sglang_zipage.harness import docs_flags as fl
from sglang_zipage.harness import docs_tables as tb

# name -> builder(root, prefix): prefix leads from the page's folder to the repository root
BLOCKS: Dict[str, Callable[[str, str], str]] = {
    "readme-results": lambda root, p: tb.readme_table(root, p),
    "readme-flags": lambda root, p: fl.readme_flags_table(),
    "readme-models": ev.coverage_summary,
    "results-steady": lambda root, p: tb.steady_table(tb.steady_pairs(root), p),
    "results-first-wave": lambda root, p: tb.first_wave_table(tb.first_wave_pairs(root), p),
    "results-elastic": tb.elastic_table,
    "results-fidelity": ev.fidelity_table,
    "results-calibrated": ev.calibrated_table,
    "results-speculative": ev.speculative_table,
    "results-speculative-coverage": ev.speculative_coverage_table,
    "results-kernels": ev.kernels_table,
    "results-coverage": ev.coverage_table,
    "results-calibrated-coverage": ev.calibrated_coverage_table,
    "results-composability": ev.composability_table,
    "results-step-profile": ev.step_profile_table,
    "results-sizing": ev.sizing_table,
    "benchmarks-commands": ev.commands_list,
    "results-soak": cpu.soak_table,
    "results-ci-time": cpu.ci_time_table,
    "results-admission": cpu.admission_table,
    "results-fidelity-cpu": cpu.fidelity_cpu_table,
    "results-self-forced": cpu.self_forced_table,
    "results-budget-sweep": cpu.budget_sweep_table,
    "reasoning-loop-guard": cpu.loop_guard_table,
    "flags-zipage": lambda root, p: fl.zipage_flags_table(),
    "flags-launcher-defaults": lambda root, p: fl.launcher_defaults_table(),
}
FIGURES: Dict[str, Callable[[str], str]] = {
    "docs/figures/throughput.svg": fig.throughput_svg,
    "docs/figures/fidelity.svg": fig.fidelity_svg,
}
BLOCK = re.compile(r"(<!-- generated:([\w-]+) begin -->\n)(.*?)(<!-- generated:\2 end -->)",
                   re.S)


def pages(root: str) -> List[str]:
    """The hand-written pages that may hold generated blocks (paths relative to root)."""
    docs = sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "*.md")))
    return ["README.md"] + docs


def render(text: str, root: str, prefix: str) -> str:
    """``text`` with every generated block printed afresh."""
    def fill(m: re.Match) -> str:
        name = m.group(2)
        if name not in BLOCKS:
            raise KeyError(f"unknown generated block {name!r}; known: {sorted(BLOCKS)}")
        return m.group(1) + BLOCKS[name](root, prefix).strip() + "\n" + m.group(4)
    return BLOCK.sub(fill, text)


def expected(root: str = ".") -> Dict[str, str]:
    """Every generated file (path relative to root) as the builders print it now."""
    out = {}
    for page in pages(root):
        with open(os.path.join(root, page)) as f:
            text = f.read()
        if BLOCK.search(text):
            out[page] = render(text, root, "../" * page.count("/"))
    out.update({path: make(root) for path, make in FIGURES.items()})
    return out


def differences(root: str = ".", want: Optional[Dict[str, str]] = None) -> List[str]:
    """The generated files whose content on disk is not what the builders print now."""
    diff = []
    for path, text in (expected(root) if want is None else want).items():
        full = os.path.join(root, path)
        if not os.path.exists(full) or open(full).read() != text:
            diff.append(path)
    return diff


def write(root: str = ".") -> List[str]:
    """Rewrite the generated files that differ; returns their paths."""
    want = expected(root)
    changed = differences(root, want)
    for path in changed:
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full) or ".", exist_ok=True)
        with open(full, "w") as f:
            f.write(want[path])
    return changed
