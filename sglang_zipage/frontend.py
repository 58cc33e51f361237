"""The hook bodies of the process that runs SGLang's tokenizer manager (the HTTP server or
an Engine): per-request options in (request_options.py), zipage's meta_info out, and a
scheduler's refusal to start (proc.Refused) raised here; the table is in hooks.py.
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


def request_options_to_custom_params(tokenizer_manager, obj, *args, **kwargs):
    from sglang_zipage import request_options

    page = tokenizer_manager.server_args.page_size or 1
    tokenize = _tokenize(tokenizer_manager)
    marker = default_think_end(tokenizer_manager)
    move = lambda p: request_options.move_to_custom_params(p, CONFIG, page, tokenize, marker)  # noqa: E731
    params = getattr(obj, "sampling_params", None)
    if isinstance(params, dict) or (params is None and marker):
        obj.sampling_params = move(params)
    elif isinstance(params, list):  # a batch: one dict per prompt
        obj.sampling_params = [move(p) if isinstance(p, dict) or p is None else p for p in params]


def _tokenize(tokenizer_manager):
    tokenizer = getattr(tokenizer_manager, "tokenizer", None)
    return None if tokenizer is None else (
        lambda text: tokenizer.encode(text, add_special_tokens=False))


_MARKER = {}  # the server's think-end ids, found once per process


def default_think_end(tokenizer_manager):
    """The server's think-end marker as token ids: --zipage-think-end, else the marker of
    SGLang's --reasoning-parser; None for none ('none', no parser, or no tokenizer)."""
    if "ids" not in _MARKER:
        text = CONFIG.think_end
        parser = getattr(tokenizer_manager.server_args, "reasoning_parser", None)
        if not text and parser:
            from sglang.srt.parser.reasoning_parser import ReasoningParser

            detector = ReasoningParser.DetectorMap.get(parser.lower())
            text = detector().think_end_token if detector else ""
        tokenize = _tokenize(tokenizer_manager)
        _MARKER["ids"] = (tokenize(text) or None) if text and text != "none" and tokenize else None
    return _MARKER["ids"]


def openai_extra_budget(result, request, *args, **kwargs):
    from sglang_zipage.request_options import FIELDS

    extra = getattr(request, "model_extra", None) or {}
    for field in FIELDS:
        if field in extra:
            result[field] = extra[field]
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


def scheduler_refusals(original, readers, procs, *args, **kwargs):
    """A scheduler that refused to start (proc.Refused) sent why on its init pipe: raise that
    here, as memory.NoRoom, where SGLang would raise "Initialization failed"."""
    return original([_RefusalPipe(r) for r in readers], procs, *args, **kwargs)


class _RefusalPipe:
    """A scheduler's init pipe, as _wait_for_scheduler_ready reads it (poll, recv)."""

    def __init__(self, pipe):
        self.pipe = pipe

    def poll(self, timeout=None):
        return self.pipe.poll(timeout)

    def recv(self):
        from sglang_zipage.memory import NoRoom
        from sglang_zipage.proc import REFUSED

        data = self.pipe.recv()
        if isinstance(data, dict) and data.get("status") == REFUSED:
            raise NoRoom(data["message"])
        return data
