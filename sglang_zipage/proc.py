"""Code that runs first inside SGLang's spawned scheduler processes.

SGLang starts schedulers with multiprocessing's spawn, so nothing the launcher patched
survives: ``run_scheduler_process`` (passed as ``run_scheduler_process_func``) installs
our hooks in the child, then hands over to SGLang's own ``run_scheduler_process``, whose
``load_plugins()`` applies them. Spawn pickles the function by reference, so this module
is imported in the child before anything else of ours: keep its top level light.
"""

from __future__ import annotations

REFUSED = "zipage_refused"  # the status of a refusing scheduler's message on its init pipe


class Refused(SystemExit):
    """This scheduler cannot start with zipage, for a reason known only once SGLang has
    profiled the memory (memory.NoRoom); the code is the message. A SystemExit, so SGLang's
    run_scheduler_process lets it through (its ``except Exception`` logs a traceback and
    sends SIGQUIT, on which the parent SIGKILLs its own process tree). Under
    ``run_scheduler_process`` below the parent raises the message (frontend.py); elsewhere
    (``sglang serve``) the child exits 1 with it."""


def run_scheduler_process(server_args, *args, **kwargs):
    from sglang_zipage import hooks, model_support
    from sglang_zipage.config import ZipageConfig

    config = model_support.with_scorer(ZipageConfig.from_env(), server_args.model_path)
    hooks.install(config, device=server_args.device,
                  page_size=server_args.page_size or 1,
                  speculative=server_args.speculative_algorithm,
                  pd_mode=server_args.disaggregation_mode)
    from sglang.srt.managers.scheduler import run_scheduler_process as _run

    try:
        return _run(server_args, *args, **kwargs)
    except Refused as e:
        _send_refusal(_run, (server_args, *args), kwargs, e.code)


def _send_refusal(run, args, kwargs, message: str) -> None:
    """Say why on the pipe the parent waits on for this scheduler's init info (where SGLang
    sends {"status": "ready", ...}), then end this process: a half-built scheduler may hold
    threads and sockets that a normal exit would wait on."""
    import inspect
    import os
    import sys

    pipe = inspect.signature(run).bind(*args, **kwargs).arguments["pipe_writer"]
    pipe.send({"status": REFUSED, "message": message})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def plugin() -> None:
    """``sglang.srt.plugins`` entry point, for schedulers started by ``sglang serve``:
    a no-op unless SGLANG_ZIPAGE_CONFIG is set, and in the main (HTTP) process."""
    import multiprocessing

    from sglang_zipage.config import ZipageConfig

    if multiprocessing.parent_process() is None:
        return

    config = ZipageConfig.from_env()
    if config is not None:
        from sglang_zipage import hooks

        hooks.install(config)
