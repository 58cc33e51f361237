"""SGLang's frontend language (``import sglang as sgl``) against a zipage server.

    python -m sglang_zipage.launch_server --port 30000 --enable-cache-report \\
        --zipage-mode fixed --zipage-kv-budget 64 --zipage-buffer 16 &
    python examples/frontend_program.py --url http://127.0.0.1:30000

Nothing here knows about zipage: the programs are plain SGLang. Each long ``sgl.gen`` below
outgrows the server's per-request KV budget (64 + 16 tokens) and is compressed while it
decodes: ``--zipage-mode fixed`` compresses every request at budget + buffer, however much
room the pool has. Under the launcher's default mode (elastic) requests keep their full KV
while the pool has room, so on an idle server nothing here would be compressed.

What you see: each program's outputs, then one row per ``sgl.gen`` with what the server
reported in its ``meta_info`` (``meta(state, name)``): prompt_tokens, cached_tokens,
completion_tokens, zipage_compactions and zipage_kv_len. On a CPU with the bundled model:

- ``first_answer`` (120 tokens), both fork drafts (100 tokens each) and the regex-constrained
  ``numbers`` are compressed (``zipage_compactions`` > 0);
- ``second_answer`` reuses the first turn's prompt from the radix cache but not the
  compressed first answer: its ``cached_tokens`` stop at ``first_answer``'s prompt_tokens;
- both drafts reuse their shared prefix (``cached_tokens`` > 0), and ``select`` picks one;
- the regex list matches its pattern in full although its KV was compressed.

SmolLM2 speaks ChatML, which SGLang's frontend does not guess from a local model path, so
the backend is opened with ``chat_template_name="chatml"``.
"""

from __future__ import annotations

import argparse
import re

import requests
import sglang as sgl

SYSTEM = "You are a patient teacher who explains every step."


@sgl.function
def two_turn_chat(s, first, second, long_tokens=120, short_tokens=32):
    """Multi-turn: the second question is asked with the whole first exchange in context."""
    s += sgl.system(SYSTEM)
    s += sgl.user(first)
    # min_tokens keeps the tiny model talking long enough to cross the budget.
    s += sgl.assistant(sgl.gen("first_answer", max_tokens=long_tokens, min_tokens=long_tokens))
    s += sgl.user(second)
    s += sgl.assistant(sgl.gen("second_answer", max_tokens=short_tokens))


@sgl.function
def two_drafts_then_pick(s, topic, draft_tokens=100):
    """fork: two drafts decode at once from one shared prefix; select: the model picks one."""
    s += sgl.system(SYSTEM)
    drafts = s.fork(2)
    for draft, style in zip(drafts, ("a short poem", "a plain explanation")):
        draft += sgl.user(f"Write {style} about {topic}.")
        draft += sgl.assistant(sgl.gen("draft", max_tokens=draft_tokens, min_tokens=draft_tokens))
    s += sgl.user(f"Draft A:\n{drafts[0]['draft']}\n\nDraft B:\n{drafts[1]['draft']}\n\n"
                  "Which draft is a poem? Answer A or B.")
    s += sgl.assistant("Draft " + sgl.gen("pick", choices=["A", "B"]))
    s["draft_meta"] = [d.get_meta_info("draft") for d in drafts]


@sgl.function
def pick_tool(s, question):
    """select: the option with the highest length-normalized log-probability wins."""
    s += sgl.user(f"{question}\nShould I use a calculator or a dictionary?")
    s += sgl.assistant("You should use a " + sgl.gen("tool", choices=["calculator", "dictionary"]))


def number_regex(count: int) -> str:
    return r"[1-9][0-9]{2}(, [1-9][0-9]{2}){%d}" % (count - 1)


@sgl.function
def constrained_numbers(s, count=25):
    """Regex-constrained generation: the output must match the pattern in full."""
    s += sgl.user(f"List {count} three-digit numbers, separated by commas.")
    s += sgl.assistant(sgl.gen("numbers", max_tokens=8 * count, regex=number_regex(count)))


@sgl.function
def short_answer(s, question, max_tokens=24):
    """A short greedy answer: never reaches the budget, so it is never compressed."""
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=max_tokens))


def backend(url: str):
    return sgl.RuntimeEndpoint(url, chat_template_name="chatml")


COLUMNS = ("prompt_tokens", "cached_tokens", "completion_tokens", "zipage_compactions",
           "zipage_kv_len")


def meta(state, name) -> dict:
    info = state.get_meta_info(name) or {}
    return {k: info.get(k) for k in COLUMNS if k in info}


def constrained_decoding_works(url: str) -> bool:
    """SGLang 0.5.17's xgrammar backend cannot run on CPU (its bitmask is a CUDA tensor, and
    the first constrained request takes the scheduler down). sglang_zipage's launcher picks
    outlines on CPU; a server started another way may not have."""
    args = requests.get(url + "/server_info", timeout=60).json()
    return not (args.get("device") == "cpu" and args.get("grammar_backend") == "xgrammar")


def one_line(text: str, width: int = 100) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[:width] + " ..."


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    url = ap.parse_args().url
    be = backend(url)
    gens = {}  # gen name -> its meta_info

    s = two_turn_chat.run("A train leaves at 9:40 and arrives at 11:15. How long is the trip?",
                          "Now say it in minutes only.", backend=be, temperature=0)
    print("== two_turn_chat (multi-turn gen)")
    print("first_answer: ", one_line(s["first_answer"]))
    print("second_answer:", one_line(s["second_answer"]))
    gens["first_answer"], gens["second_answer"] = meta(s, "first_answer"), meta(s, "second_answer")

    s = two_drafts_then_pick.run("the moon", backend=be, temperature=0)
    print("== two_drafts_then_pick (fork + select)")
    for label, draft in zip("AB", s["draft_meta"]):
        gens[f"draft {label}"] = {k: draft.get(k) for k in COLUMNS if k in draft}
    print("picked draft:", s["pick"])

    s = pick_tool.run("What is 37 times 91?", backend=be)
    print("== pick_tool (select):", s["tool"])

    print("== constrained_numbers (regex)")
    if constrained_decoding_works(url):
        s = constrained_numbers.run(backend=be, temperature=0)
        print(one_line(s["numbers"]))
        print("full match:", re.fullmatch(number_regex(25), s["numbers"]) is not None)
        gens["numbers"] = meta(s, "numbers")
    else:
        print("skipped: this CPU server uses --grammar-backend xgrammar, which crashes on CPU in "
              "SGLang 0.5.17; restart it with --grammar-backend outlines")

    print("\ngen          ", *COLUMNS, sep="  ")
    for name, info in gens.items():
        print(f"{name:13}", *(f"{info.get(c)!s:>{len(c)}}" for c in COLUMNS), sep="  ")


if __name__ == "__main__":
    main()
