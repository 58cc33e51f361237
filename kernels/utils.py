"""Launch helpers shared by the Triton wrappers: lazy jit, layer tables, checks.

Kernels are decorated with `triton.jit` on their first launch, not at import.
Triton picks the interpreter or the compiler when it decorates, so a CPU test
only has to set TRITON_INTERPRET=1 before its first launch, whatever imported
this package earlier.
"""

from __future__ import annotations

from typing import Callable, Dict, Sequence, Tuple

import torch

_TABLE_CACHE: Dict[Tuple, torch.Tensor] = {}
_TABLE_CACHE_MAX = 64


class LazyJit:
    """`kernel[grid](...)` that runs `triton.jit(fn, **options)` on the first launch."""

    def __init__(self, fn: Callable, options: Dict):
        self.fn, self.options = fn, options
        self._jitted = None

    def __getitem__(self, grid):
        if self._jitted is None:
            import triton

            scope = self.fn.__globals__  # the @jit_helper functions it calls, jitted first
            for name, value in list(scope.items()):
                if isinstance(value, JitHelper):
                    scope[name] = triton.jit(value.fn)
            self._jitted = triton.jit(self.fn, **self.options)
        return self._jitted[grid]

    def compiled_variants(self):
        """How many variants Triton compiled so far (None under the interpreter)."""
        if self._jitted is None:
            return 0
        caches = getattr(self._jitted, "device_caches", None)  # JITFunction's, per device
        return None if caches is None else sum(len(c[0]) for c in caches.values())


class JitHelper:
    """A device function kernels call (``@jit_helper``): it becomes ``triton.jit(fn)``, in
    its module's namespace, when the first kernel of that module launches."""

    def __init__(self, fn: Callable):
        self.fn = fn


def jit_helper(fn: Callable) -> JitHelper:
    return JitHelper(fn)


def lazy_jit(*, batch_args: Sequence[str] = ()) -> Callable[[Callable], LazyJit]:
    """Decorator. ``batch_args``: integer arguments that change with the batch (request
    count, lengths, strides derived from them). Triton would compile one variant per
    value class it sees (== 1, divisible by 16, other), each a stall of seconds for every
    running request when it first appears mid-serving; these get one variant, which the
    runtime's warm-up compiles at startup."""
    return lambda fn: LazyJit(fn, {"do_not_specialize": tuple(batch_args)})


def layer_ptr_table(buffers: Sequence[torch.Tensor]) -> torch.Tensor:
    """[L] int64 tensor of data_ptr()s, on the buffers' device, cached.

    One launch reads every layer through it: the kernel loads entry l and casts it
    with `.to(tl.pointer_type(dtype))`. Cached by pointer values so decode-time
    calls do not pay a host-to-device copy each time.
    """
    key = (buffers[0].device, tuple(b.data_ptr() for b in buffers))
    table = _TABLE_CACHE.get(key)
    if table is None:
        if len(_TABLE_CACHE) >= _TABLE_CACHE_MAX:
            _TABLE_CACHE.clear()
        table = torch.tensor(key[1], dtype=torch.int64).to(buffers[0].device)
        _TABLE_CACHE[key] = table
    return table


def check_layer_buffers(name: str, buffers: Sequence[torch.Tensor], ndim: int) -> None:
    """All layers share shape, dtype, strides and device; last dim contiguous."""
    if len(buffers) == 0:
        raise ValueError(f"{name}: empty list of layer buffers")
    ref = buffers[0]
    if ref.dim() != ndim:
        raise ValueError(f"{name}[0]: expected {ndim} dims, got shape {tuple(ref.shape)}")
    if ref.stride(-1) != 1:
        raise ValueError(f"{name}[0]: last dim must be contiguous, strides {ref.stride()}")
    for i, b in enumerate(buffers):
        if (b.shape, b.dtype, b.stride(), b.device) != (ref.shape, ref.dtype, ref.stride(), ref.device):
            raise ValueError(
                f"{name}[{i}]: shape/dtype/strides/device {tuple(b.shape)} {b.dtype} "
                f"{b.stride()} {b.device} differ from layer 0: {tuple(ref.shape)} "
                f"{ref.dtype} {ref.stride()} {ref.device}"
            )


def check_tensor(name: str, t: torch.Tensor, shape: Tuple, dtypes, device) -> None:
    """Shape (None = any size), dtype (one of `dtypes`) and device check."""
    if t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape)):
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name}: expected dtype in {dtypes}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name}: on {t.device}, expected {device}")


def triton_dtype(dtype: torch.dtype):
    import triton.language as tl

    table = {
        torch.float16: tl.float16,
        torch.bfloat16: tl.bfloat16,
        torch.float32: tl.float32,
        torch.uint8: tl.uint8,  # fp8 KV is stored as uint8 in SGLang
        torch.int8: tl.int8,
    }
    if dtype not in table:
        raise ValueError(f"unsupported KV dtype {dtype}; expected fp16, bf16, fp32 or uint8")
    return table[dtype]


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


# uint8-stored FP8 keys: the KEY_FP8 code a kernel bitcasts them with
FP8_CODES = {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2}


def check_rope(rope, q_window) -> None:
    """A Rope fits q_window [L, R, W, Hq, D] (reference.Rope's contract)."""
    rot = rope.cos_sin.shape[-1] if rope.cos_sin.dim() == 2 else -1
    if rot <= 0 or rot % 2 or rope.start < 0 or rope.start + rot > q_window.shape[-1]:
        raise ValueError(f"rope: a table [P, R] with even R and start + R <= "
                         f"{q_window.shape[-1]}; got {tuple(rope.cos_sin.shape)}, start "
                         f"{rope.start}")
    if rope.cos_sin.stride(-1) != 1:
        raise ValueError("rope.cos_sin: rows must be contiguous")
    check_tensor("rope.cos_sin", rope.cos_sin, (None, rot),
                 (torch.float32, torch.float16, torch.bfloat16), q_window.device)
    check_tensor("rope.positions", rope.positions, (q_window.shape[1],), (torch.int64,),
                 q_window.device)


def check_window_inputs(q_window, k_buffers, src_slots, src_lens, key_dtype, key_scales,
                        rope=None) -> None:
    """The shapes, dtypes and strides window_attention_scores takes (scores.py)."""
    if rope is not None:
        check_rope(rope, q_window)
    if q_window.dim() != 5:
        raise ValueError(f"q_window: expected [L, R, W, Hq, D], got {tuple(q_window.shape)}")
    n_layers, n_req, _, hq, d = q_window.shape
    if len(k_buffers) != n_layers:
        raise ValueError(f"k_buffers: {len(k_buffers)} layers, q_window has {n_layers}")
    check_layer_buffers("k_buffers", k_buffers, 3)
    _, hkv, d_k = k_buffers[0].shape
    if d_k != d or hq % hkv != 0:
        raise ValueError(f"q_window heads/dim {hq}/{d} do not fit k_buffers heads/dim {hkv}/{d_k}")
    if key_dtype is not None and key_dtype not in FP8_CODES:
        raise ValueError(f"key_dtype: expected None or one of {list(FP8_CODES)}, got {key_dtype}")
    k_dtype = torch.uint8 if key_dtype is not None else q_window.dtype
    check_tensor("k_buffers[0]", k_buffers[0], (None, hkv, d), (k_dtype,), q_window.device)
    if key_scales is not None:
        check_tensor("key_scales", key_scales, (n_layers,), (torch.float32,), q_window.device)
    if q_window.stride(-1) != 1:
        raise ValueError(f"q_window: last dim must be contiguous, strides {q_window.stride()}")
    check_tensor("src_slots", src_slots, (n_req, None), (torch.int64,), q_window.device)
    check_tensor("src_lens", src_lens, (n_req,), (torch.int32, torch.int64), q_window.device)
    if src_slots.stride(-1) != 1:
        raise ValueError("src_slots: rows must be contiguous")
