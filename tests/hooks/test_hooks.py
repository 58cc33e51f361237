"""Every hook target exists in SGLang 0.5.17 and carries our wrapper after install().

HookRegistry patches cannot be undone, so install() runs in a fresh subprocess.
Run: .venv/bin/python -m pytest tests/hooks
"""

import subprocess
import sys

SCRIPT = r"""
import pkgutil
from sglang_zipage import hooks
from sglang_zipage.config import ZipageConfig
hooks.install(ZipageConfig(kv_budget=64, buffer=16), device="cpu", page_size=1)
hooks.install(ZipageConfig(kv_budget=64, buffer=16), device="cpu", page_size=1)  # idempotent
from sglang.srt.managers import schedule_policy
from sglang.srt.layers.rotary_embedding import base
assert schedule_policy.CLIP_MAX_NEW_TOKENS == 81, schedule_policy.CLIP_MAX_NEW_TOKENS
assert base._is_cpu is True
n = 0
for target, kind, body, why in hooks._hook_table() + hooks._speculative_hook_table(None):
    obj_path, attr = ("sglang.srt." + target).rsplit(".", 1)
    fn = getattr(pkgutil.resolve_name(obj_path), attr)
    fn = getattr(fn, "__func__", fn)
    assert body.__name__ in repr(fn.__closure__ and [c.cell_contents for c in fn.__closure__]), target
    assert why, target
    n += 1
print("HOOKED", n)
"""


def test_every_target_resolves_and_is_wrapped():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    from sglang_zipage import hooks

    rows = len(hooks._hook_table()) + len(hooks._speculative_hook_table(None))
    assert f"HOOKED {rows}" in r.stdout  # every row checked


def test_disabled_config_installs_no_hook():
    script = ("from sglang_zipage import hooks\nfrom sglang_zipage.config import ZipageConfig\n"
              "hooks.install(ZipageConfig(enabled=False), device='cpu')\n"
              "from sglang.srt.plugins.hook_registry import HookRegistry\n"
              "from sglang_zipage import scheduler_hooks\n"
              "assert scheduler_hooks.RUNTIME is None and not HookRegistry._hooks, HookRegistry._hooks\n"
              "print('STOCK')")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "STOCK" in r.stdout
