"""``sglang_zipage.Engine``: SGLang's offline Engine with Compressed PagedAttention.

Same constructor arguments as ``sglang.Engine`` plus the zipage options, either as a
``zipage=ZipageConfig(...)`` object or as ``zipage_<field>=...`` keywords
(``zipage_kv_budget=512``, ``zipage_enabled=False``). Defaults as in the launcher. A start
zipage refuses raises ValueError before anything starts (``checked``), or memory.NoRoom with
the message once the scheduler has profiled the memory.
"""

from __future__ import annotations

import dataclasses

from sglang.srt.entrypoints.engine import Engine as SGLangEngine

from sglang_zipage import hooks, model_support
from sglang_zipage import server_args as zargs
from sglang_zipage.config import ZipageConfig
from sglang_zipage.proc import run_scheduler_process


def checked(zipage: ZipageConfig = None, **kwargs):
    """(server_args, config) of ``Engine(zipage, **kwargs)``, or the ValueError (TypeError for
    an unknown option) its startup would refuse with, without starting anything: a caller
    can ask whether a configuration is refused before spending an engine start on it."""
    fields = {f.name for f in dataclasses.fields(ZipageConfig)}
    picked = {k[len("zipage_"):]: kwargs.pop(k) for k in list(kwargs)
              if k.startswith("zipage_") and k[len("zipage_"):] in fields}
    unknown = [k for k in kwargs if k.startswith("zipage_")]
    if unknown:
        raise TypeError(f"unknown zipage options {unknown}; known: "
                        f"{sorted('zipage_' + f for f in fields)}")
    config = dataclasses.replace(zipage or ZipageConfig(), **picked)
    invalid = []
    if config.enabled:  # once, in this process
        try:
            config.validate(page_size=kwargs.get("page_size") or 1)
        except ValueError as e:
            invalid.append(str(e))
    import torch

    kwargs.update(zargs.default_overrides(kwargs, config, has_cuda=torch.cuda.is_available()))
    kwargs.setdefault("log_level", "error")  # as sglang.Engine does
    try:
        server_args = Engine.server_args_class(**kwargs)
    except Exception:
        if invalid:  # ours first: SGLang may fail on what the user would fix next
            raise ValueError(invalid[0]) from None
        raise
    config = model_support.with_scorer(config, server_args.model_path)
    problems = zargs.incompatibilities(server_args, config, invalid)
    if problems:
        raise ValueError("; ".join(problems))
    return server_args, config


class Engine(SGLangEngine):
    run_scheduler_process_func = staticmethod(run_scheduler_process)

    def __init__(self, zipage: ZipageConfig = None, **kwargs):
        server_args, config = checked(zipage, **kwargs)
        zargs.set_process_env(server_args.device, server_args.page_size)
        config.to_env()
        hooks.install(None, device=server_args.device)
        hooks.install_frontend(config)
        self.zipage_config = config
        super().__init__(server_args=server_args)
