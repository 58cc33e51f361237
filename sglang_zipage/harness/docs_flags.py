"""The flag tables of the docs, from the launcher's own argparse definitions: the
``--zipage-*`` group that ``ZipageConfig.add_cli_args`` adds, SGLang's parser as
``python -m sglang_zipage.launch_server --help`` builds it, and the defaults the launcher
sets (``server_args``). Only ``readme_flags_table`` imports sglang (about 7 s).
"""

from __future__ import annotations

import argparse
import re
from typing import Dict, List, Sequence, Tuple

from sglang_zipage.config import ZipageConfig
from sglang_zipage.harness.docs_tables import md_table
from sglang_zipage.server_args import CPU_DEFAULTS, graph_max_bs

DEFAULT = re.compile(r"\s*\(default: ([^)]*)\)$")


def _actions(parser: argparse.ArgumentParser) -> Dict[str, argparse.Action]:
    return {flag: a for a in parser._actions for flag in a.option_strings}


def _help_and_default(action: argparse.Action) -> Tuple[str, str]:
    """The help text without its "(default: ...)" tail, and that default (or argparse's)."""
    text = " ".join((action.help or "").split())
    m = DEFAULT.search(text)
    if m:
        return text[:m.start()], m.group(1) or '""'
    return text, "-" if action.default in (None, False) else str(action.default)


def zipage_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    ZipageConfig.add_cli_args(parser)
    return parser


def zipage_flags_table() -> str:
    """Every --zipage-* flag: default, accepted values, what it does."""
    rows = []
    for a in zipage_parser()._actions:
        text, default = _help_and_default(a)
        values = (", ".join(a.choices) if a.choices else
                  "flag" if a.nargs == 0 else (a.type.__name__ if a.type else "str"))
        text = text.replace("<", "&lt;").replace(">", "&gt;")  # </think> is not a tag
        rows.append((f"`{a.option_strings[0]}`", default, values, text))
    return md_table(("flag", "default", "values", "what it does"), rows)


def launcher_defaults_table() -> str:
    """SGLang flags the launcher sets when the user did not."""
    rows = [(f"`--{k.replace('_', '-')}`", "on" if v is True else f"`{v}`", "no GPU")
            for k, v in CPU_DEFAULTS.items()]
    rows += [("`--attention-backend`", "`flashinfer`", "a GPU, zipage on"),
             ("`--cuda-graph-max-bs-decode`",
              f"`{graph_max_bs(ZipageConfig())}` at one budget; budget / floor times that with "
              f"`--zipage-min-kv-budget`, at most `{graph_max_bs(ZipageConfig(min_kv_budget=64))}`",
              "a GPU, zipage on"),
             ("`--model-path`", "the bundled SmolLM2-135M-Instruct", "always")]
    return md_table(("flag", "launcher default", "when"), rows)


# The flags people change, with a short meaning: (flags, meaning); the defaults come from
# the parser that --help prints.
README_FLAGS: Sequence[Tuple[Tuple[str, ...], str]] = (
    (("--zipage-kv-budget",), "decode tokens a request keeps (per KV head) after a compaction"),
    (("--zipage-buffer",), "decode tokens written between two compactions"),
    (("--zipage-mode",), "`elastic`: full KV while the pool has room, compress under pressure; "
                         "`fixed`: compress at budget + buffer always"),
    (("--zipage-min-kv-budget",), "the floor running requests are squeezed to while requests "
                                  "wait (elastic; 0: no squeeze)"),
    (("--zipage-compress-prompt",), "compress the unshared part of each prompt with the output"),
    (("--zipage-think-end",), "text closing a reasoning model's thinking: the answer is never "
                              "evicted (empty: the reasoning parser's)"),
    (("--zipage-answer-budget",), "compact the thinking once more, to this many tokens, when "
                                  "the answer starts"),
    (("--zipage-disable",), "stock SGLang"),
    (("--model-path",), "the model (the launcher's default: the bundled SmolLM2-135M)"),
    (("--host", "--port"), "where the HTTP server listens"),
    (("--tp-size", "--dp-size"), "tensor / data parallel ([docs/scale-out.md](docs/scale-out.md))"),
    (("--max-running-requests",), "cap the batch (a shorter step, fewer requests at once)"),
    (("--kv-cache-dtype",), "`fp8_e4m3` doubles the tokens a pool holds"),
    (("--attention-backend",), "flashinfer (the launcher's GPU default), triton or "
                               "torch_native (its CPU default)"),
    (("--reasoning-parser",), "SGLang's reasoning parser; its marker protects the answer"),
)


def readme_flags_table() -> str:
    from sglang_zipage.launch_server import _sglang_parser

    parser = _sglang_parser()
    ZipageConfig.add_cli_args(parser)
    actions = _actions(parser)
    rows: List[Tuple[str, str, str]] = []
    for flags, meaning in README_FLAGS:
        defaults = [_help_and_default(actions[f])[1] for f in flags]
        rows.append((" / ".join(f"`{f}`" for f in flags), " / ".join(defaults), meaning))
    return md_table(("flag", "default", "what it does"), rows)
