"""sglang-zipage: Zipage's Compressed PagedAttention inside SGLang 0.5.17.

Import-light on purpose: SGLang spawns its scheduler processes, which re-import the
launcher; heavy imports happen inside functions.
"""

__version__ = "0.1.0"

__all__ = ["Engine", "ZipageConfig", "__version__"]


def __getattr__(name):
    if name == "Engine":
        from sglang_zipage.engine import Engine

        return Engine
    if name == "ZipageConfig":
        from sglang_zipage.config import ZipageConfig

        return ZipageConfig
    raise AttributeError(name)
