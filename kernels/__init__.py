"""Zipage compression kernels: Triton ops and their torch twins.

Ops (each has a twin `<op>_ref` in `reference.py` with the same signature):
  window_attention_scores(q_window, k_buffers, src_slots, src_lens, sm_scale,
                          key_dtype=None, key_scales=None, rope=None)
      -> [L, R, Hkv, S_max] float32 attention score of each compressible token; with a
      Rope, the queries are pre-RoPE and rotated to each request's position first (rope.py).
  global_scores(attention, score_buffers, src_slots, src_lens, n_stored, first, pooling,
                decay, sink, window)
      -> (final, g): pooling (first compaction), decay against the stored global
      scores, protection of sink and window; both [L, R, Hkv, S_max] float32.
  compact_kv(k_buffers, v_buffers, score_buffers, src_slots, keep, dst_slots, kept_scores)
      -> None; moves each head's kept tokens into dst_slots, in place.
  select_topk(scores, k) -> [L, R, Hkv, k] int64 kept positions (torch only).

Backend switch (``SGLANG_ZIPAGE_KERNELS`` = triton | ref): dispatch.py.

This folder is the repository's top-level ``kernels/``, installed as the package
``sglang_zipage.kernels`` (pyproject.toml, package-dir): PyPI's ``kernels``, which SGLang
and transformers import, owns the top-level name.
"""

if __name__ == "kernels":
    # Imported as a top-level ``kernels``: a process started in the repository root has
    # this folder on sys.path, where it would shadow PyPI's ``kernels``. Hand the name to
    # that package, in this module's place in sys.modules.
    import importlib.machinery
    import importlib.util
    import os
    import sys

    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _root]
    _spec = importlib.machinery.PathFinder.find_spec("kernels", _path)
    if _spec is None:
        raise ModuleNotFoundError("No module named 'kernels'", name="kernels")
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["kernels"] = _module
    _spec.loader.exec_module(_module)
else:
    from sglang_zipage.kernels.dispatch import *  # noqa: F401,F403
    from sglang_zipage.kernels.dispatch import __all__  # noqa: F401
