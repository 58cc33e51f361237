"""The examples keep their docstrings' promises (issue 44): each runs, as a user runs it,
against a server started with the command its docstring gives.

The server and client commands are read from the example's docstring (only port 30000
becomes a free one), so the documentation and this test cannot drift: a command that
loses what makes compression visible (``--zipage-mode fixed``: under the launcher's
default, elastic, an idle server keeps full KV) fails here. Checked from what the example
prints:

- examples/agent_multiturn.py: every turn is compressed, and the next turn's cache hit
  stops at the previous turn's prompt. The bound, from the code: a request's prompt enters
  the radix tree once, after its prefill (SGLang's cache_unfinished_req inserts the
  page-aligned prompt, ``cache_protected_len``); zipage compresses only columns from
  c0 = max(cache_protected_len, floor_page(prompt_len)) on and marks a compressed request
  skip_radix_cache_insert, so neither decode steps nor the request's end insert anything
  past c0. Turn t+1's prompt starts with turn t's prompt followed by turn t's answer, hence
      floor_page(lcp) <= cached_tokens(t+1) <= c0(t) = floor_page(prompt_tokens(t)),
  where lcp >= prompt_tokens(t) - 1 (the chat template renders the earlier turns unchanged;
  only a newline at the end of turn t's prompt can merge with its answer's first characters).
  A control turn decoded with compression off (zipage_kv_budget 0) is reused whole.
- examples/frontend_program.py: the long gens (multi-turn, fork drafts, regex) are
  compressed, the second turn reuses the first turn's prompt but not its compressed answer,
  the drafts reuse their shared prefix and the regex output matches in full.

Run: .venv/bin/python -m pytest -p no:xdist tests/e2e/test_examples.py
"""

import re
import shlex
import subprocess
import sys

import pytest
import requests

from sglang_zipage.harness.server import STRICT_MEM_ENV, Server
from zipage_server import REPO, assert_healthy, load_example

LAUNCHER = "python -m sglang_zipage.launch_server"
DOC_PORT = "30000"


def documented_commands(name):
    """(server flags, client argv) of the commands in examples/<name>.py's docstring: the
    launcher's flags without ``--port 30000``, the client's arguments with 30000 in them."""
    doc = load_example(name).__doc__.replace("\\\n", " ")
    lines = [line.strip().rstrip("&").strip() for line in doc.splitlines()]
    server = shlex.split(next(line for line in lines if line.startswith(LAUNCHER)))[3:]
    client = shlex.split(next(line for line in lines if line.startswith(f"python examples/{name}.py")))
    at = server.index("--port")
    assert server[at + 1] == DOC_PORT
    return server[:at] + server[at + 2:], client[1:]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Documented server flags -> a running server; the examples share one when their
    docstrings give the same command."""
    started = {}

    def get(flags):
        if tuple(flags) not in started:
            log = tmp_path_factory.mktemp("examples") / "server.log"
            started[tuple(flags)] = Server(flags, log, env=STRICT_MEM_ENV)
        return started[tuple(flags)]

    yield get
    for srv in started.values():
        assert srv.stop() == []


def run_example(name, servers):
    """Start (or reuse) the documented server, empty its cache, run the documented client
    command on it; returns (server, what the example printed)."""
    flags, argv = documented_commands(name)
    srv = servers(flags)
    srv.idle_and_flushed()
    argv = [a.replace(DOC_PORT, str(srv.port)) for a in argv]
    done = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return srv, done.stdout


def table(out, first_column):
    """The rows of the table the example printed, under the header that starts with
    ``first_column``: one dict per row, the first column as text, the others as ints."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [first_column])
    header = lines[start].split()
    rows = []
    for line in lines[start + 1:]:
        m = re.fullmatch(r"\s*(\S.*?)((?:\s+-?\d+){%d})\s*" % (len(header) - 1), line)
        if m:
            rows.append({header[0]: m.group(1), **dict(zip(header[1:], map(int, m.group(2).split())))})
    assert rows, out
    return rows


def floor_page(n, page):
    return n // page * page


def test_agent_example_compresses_each_turn_and_reuses_only_prompts(servers):
    srv, out = run_example("agent_multiturn", servers)
    page = requests.get(srv.url + "/server_info", timeout=60).json()["page_size"] or 1
    turns = table(out, "turn")
    assert len(turns) == len(load_example("agent_multiturn").TASKS), out
    for t in turns:
        assert t["zipage_compactions"] >= 1, out
        assert t["zipage_kv_len"] < t["prompt_tokens"] + t["completion_tokens"], out
    for prev, cur in zip(turns, turns[1:]):
        c0 = floor_page(prev["prompt_tokens"], page)
        assert floor_page(prev["prompt_tokens"] - 1, page) <= cur["cached_tokens"] <= c0, out
        assert cur["prompt_tokens"] > c0 + prev["completion_tokens"], out  # the answer is in it

    # Control: an answer decoded with compression off for that request is inserted whole,
    # and the next turn's hit covers it (the bound above is specific to compressed answers).
    agent = load_example("agent_multiturn")
    client = agent.client_for(srv.url)
    messages = [{"role": "system", "content": agent.SYSTEM},
                {"role": "user", "content": agent.TASKS[0]}]
    answer, plain = agent.ask(client, messages, max_tokens=32, min_tokens=32, zipage_kv_budget=0)
    assert plain["zipage_compactions"] == 0 and plain["completion_tokens"] == 32
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Thanks."}]
    _, after = agent.ask(client, messages, max_tokens=1)
    assert after["cached_tokens"] > floor_page(plain["prompt_tokens"], page)
    assert after["cached_tokens"] == after["meta_cached_tokens"]  # usage agrees with meta_info
    assert_healthy(srv)


def test_frontend_example_compresses_its_long_gens(servers):
    srv, out = run_example("frontend_program", servers)
    gens = {row["gen"]: row for row in table(out, "gen")}
    assert set(gens) == {"first_answer", "second_answer", "draft A", "draft B", "numbers"}, out
    for name in ("first_answer", "draft A", "draft B", "numbers"):
        assert gens[name]["zipage_compactions"] >= 1, out
    first, second = gens["first_answer"], gens["second_answer"]
    # The second turn reuses the first turn's prompt, never the compressed first answer.
    assert 0 < second["cached_tokens"] <= first["prompt_tokens"], out
    assert second["prompt_tokens"] > first["prompt_tokens"] + first["completion_tokens"], out
    assert gens["draft A"]["cached_tokens"] > 0 and gens["draft B"]["cached_tokens"] > 0, out
    assert re.search(r"^picked draft: [AB]$", out, re.M), out
    assert re.search(r"^== pick_tool \(select\): (calculator|dictionary)$", out, re.M), out
    assert "full match: True" in out, out
    assert_healthy(srv)
