"""``python -m sglang_zipage.launch_server``: SGLang's server with Compressed PagedAttention.

Takes every ``sglang.launch_server`` flag unchanged plus the ``--zipage-*`` flags. Spawned
SGLang children re-import this module, so its top level imports nothing heavy. A start zipage
refuses exits with code 1 and the message, no traceback: before any SGLang process starts
where the flags and the model's config tell (``prepare``), else once the scheduler has
profiled the memory (memory.NoRoom, sent back by proc.Refused).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

PROG = "python -m sglang_zipage.launch_server"


def _sglang_parser(suppress_defaults: bool = False) -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog=PROG, add_help=not suppress_defaults)
    ServerArgs.add_cli_args(parser)
    if suppress_defaults:
        for action in parser._actions:
            action.default = argparse.SUPPRESS
            action.required = False
    return parser


def print_help() -> None:
    from sglang_zipage.config import ZipageConfig

    parser = _sglang_parser()
    ZipageConfig.add_cli_args(parser)
    parser.description = ("SGLang server with Zipage's Compressed PagedAttention. Without "
                          "--model-path it serves the bundled SmolLM2-135M-Instruct; without "
                          "a GPU it runs on SGLang's CPU path.")
    parser.print_help()


def _to_argv(overrides: dict) -> List[str]:
    argv = []
    for name, value in overrides.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        else:
            argv += [flag, str(value)]
    return argv


def prepare(argv: List[str]):
    """Parse and validate everything; exit with a message naming the flag on errors.

    Returns (server_args, zipage_config). Exports the config for the scheduler children.
    """
    from sglang_zipage.config import ZipageConfig, ZipageConfigError

    config, rest = ZipageConfig.parse_known(argv)
    given, _unknown = _sglang_parser(suppress_defaults=True).parse_known_args(rest)
    invalid = []
    if config.enabled:  # once, in this process
        try:
            config.validate(page_size=getattr(given, "page_size", None) or 1)
        except ZipageConfigError as e:
            invalid.append(str(e))
    import torch

    from sglang_zipage import model_support
    from sglang_zipage import server_args as zargs

    overrides = zargs.default_overrides(vars(given), config, has_cuda=torch.cuda.is_available())
    from sglang.srt.server_args import prepare_server_args

    try:
        server_args = prepare_server_args(rest + _to_argv(overrides))
    except Exception:
        if invalid:  # ours first: SGLang may fail on what the user would fix next
            sys.exit(f"{PROG}: error: {invalid[0]}")
        raise
    config = model_support.with_scorer(config, server_args.model_path)
    problems = zargs.incompatibilities(server_args, config, invalid)
    if problems:
        sys.exit(f"{PROG}: error: " + "; ".join(problems))
    zargs.set_process_env(server_args.device, server_args.page_size)
    config.to_env()
    return server_args, config


def main(argv: Optional[List[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print_help()
        return
    server_args, config = prepare(argv)
    from sglang_zipage import hooks

    hooks.install(None, device=server_args.device)  # CPU fixes for this process
    hooks.install_frontend(config)  # before http_server builds its routes
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.utils import kill_process_tree

    from sglang_zipage.memory import NoRoom
    from sglang_zipage.proc import run_scheduler_process
    try:
        launch_server(server_args, run_scheduler_process_func=run_scheduler_process)
    except NoRoom as e:  # known once the scheduler profiled the memory (proc.Refused)
        sys.exit(f"{PROG}: error: {e}")
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main()
