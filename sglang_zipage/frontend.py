"""The hook bodies of the process that runs SGLang's tokenizer manager (the HTTP server or
an Engine): per-request budgets in, zipage's meta_info out (the table is in hooks.py).
"""

from __future__ import annotations

CONFIG = None  # the zipage config of this process, once hooks.install_frontend ran


def fold_meta_info(original, tokenizer_manager, *args, **kwargs):
    from sglang_zipage import meta_info

    async def responses():
        async for out in original(tokenizer_manager, *args, **kwargs):
            meta_info.fold(out)
            yield out

    return responses()


def request_budget_to_custom_params(tokenizer_manager, obj, *args, **kwargs):
    from sglang_zipage import request_budget

    if isinstance(getattr(obj, "sampling_params", None), dict):
        obj.sampling_params = request_budget.move_to_custom_params(
            obj.sampling_params, CONFIG, tokenizer_manager.server_args.page_size or 1)


def openai_extra_budget(result, request, *args, **kwargs):
    from sglang_zipage.request_budget import FIELD

    extra = getattr(request, "model_extra", None) or {}
    if FIELD in extra:
        result[FIELD] = extra[FIELD]
    return result


def openai_completion_budget(result, serving, request):
    return openai_extra_budget(result, request)


def keep_openai_extra_fields() -> None:
    """Keep unknown request fields (model_extra) so extra_body reaches our hooks; must run
    before http_server builds its FastAPI routes from these models."""
    from sglang.srt.entrypoints.openai import protocol

    for model in (protocol.ChatCompletionRequest, protocol.CompletionRequest):
        if model.model_config.get("extra") != "allow":
            model.model_config["extra"] = "allow"
            model.model_rebuild(force=True)
