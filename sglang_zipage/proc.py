"""Code that runs first inside SGLang's spawned scheduler processes.

SGLang starts schedulers with multiprocessing's spawn, so nothing the launcher patched
survives: ``run_scheduler_process`` (passed as ``run_scheduler_process_func``) installs
our hooks in the child, then hands over to SGLang's own ``run_scheduler_process``, whose
``load_plugins()`` applies them. Spawn pickles the function by reference, so this module
is imported in the child before anything else of ours: keep its top level light.
"""

from __future__ import annotations


def run_scheduler_process(server_args, *args, **kwargs):
    from sglang_zipage import hooks
    from sglang_zipage.config import ZipageConfig

    hooks.install(ZipageConfig.from_env(), device=server_args.device,
                  page_size=server_args.page_size or 1)
    from sglang.srt.managers.scheduler import run_scheduler_process as _run

    return _run(server_args, *args, **kwargs)


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
