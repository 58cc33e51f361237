"""Real servers on the bundled model (CPU in CI), shared by the e2e tests of a session.

Every server runs SGLang's strict memory checker (leaks, double frees, page invariants
are checked after every busy step); a checker failure kills the scheduler, which the
tests see as a failed request or an unhealthy server and as a traceback in the log.
"""

import pytest

from zipage_server import CHUNK_TOKENS, POOL_TOKENS, SMALL_BUDGET, STRICT_MEM_ENV, Server


def _server(tmp_path_factory, name, args):
    log = tmp_path_factory.mktemp("servers") / f"{name}.log"
    srv = Server(["--max-total-tokens", POOL_TOKENS, "--chunked-prefill-size", CHUNK_TOKENS, *args],
                 log, env=STRICT_MEM_ENV)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def zipage_server(tmp_path_factory):
    """Compression on with a small budget (64 + buffer 16), so it compresses often; OpenAI
    usage reports cached prompt tokens (--enable-cache-report)."""
    yield from _server(tmp_path_factory, "zipage",
                       [*SMALL_BUDGET, "--enable-metrics", "--enable-cache-report"])


@pytest.fixture(scope="session")
def stock_server(tmp_path_factory):
    """--zipage-disable: stock SGLang behaviour (only the CPU fixes and model default)."""
    yield from _server(tmp_path_factory, "stock", ["--zipage-disable"])


@pytest.fixture(scope="session")
def default_server(tmp_path_factory):
    """Compression on with the default budget: no short request ever compresses."""
    yield from _server(tmp_path_factory, "default", [])
