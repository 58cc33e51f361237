"""A multi-turn reasoning agent on the OpenAI API of a zipage server.

    python -m sglang_zipage.launch_server --port 30000 --enable-cache-report \\
        --zipage-mode fixed --zipage-kv-budget 64 --zipage-buffer 16 &
    python examples/agent_multiturn.py --url http://127.0.0.1:30000

Plain OpenAI SDK code: every turn sends the whole conversation so far (system prompt,
earlier questions and the model's earlier answers) and asks for a long step-by-step answer.

Why these flags: ``--zipage-mode fixed`` compresses every answer whose KV reaches
budget + buffer (64 + 16 tokens), however much room the pool has. Under the launcher's
default mode (elastic) requests keep their full KV while the pool has room, so one agent on
an idle server is never compressed and behaves exactly as in stock SGLang.
``--enable-cache-report`` makes SGLang fill ``usage.prompt_tokens_details.cached_tokens``.

What you see: one row per turn with ``prompt_tokens``, ``cached_tokens`` (prompt tokens
served from SGLang's radix cache), ``completion_tokens``, and from the response's
``meta_info`` (an SGLang extension, asked for with ``return_meta_info``)
``zipage_compactions`` and ``zipage_kv_len`` (KV tokens held at the end, prompt included).
On a CPU with the bundled model one run printed (each row is followed by the start of
that turn's answer):

    turn  prompt_tokens  cached_tokens  completion_tokens  zipage_compactions  zipage_kv_len
       1             64              0                128                   3            144
       2            223             64                128                   3            303
       3            386            223                128                   3            466

- every turn is compressed (``zipage_compactions`` > 0): ``zipage_kv_len`` stays at most
  ``prompt_tokens`` + 80 while the answer is longer than 80 tokens;
- the next turn's cache hit stops at the previous turn's prompt: a compressed answer is
  lossy, so it never enters the radix cache, and ``cached_tokens`` of turn t+1 equals
  ``prompt_tokens`` of turn t (one token less where the chat template's newline merges
  with the answer; with ``--page-size`` > 1, floored to a page).
"""

from __future__ import annotations

import argparse

import openai

SYSTEM = "You are a careful assistant. Think step by step and show all your reasoning."
TASKS = (
    "A warehouse holds 120 boxes. 35 boxes are shipped on Monday and 48 arrive on Tuesday. "
    "How many boxes are in the warehouse now?",
    "Each box weighs 12 kg. What is the total weight of the boxes in the warehouse now?",
    "A truck carries at most 500 kg per trip. How many trips does it take to move all boxes?",
)
COLUMNS = ("prompt_tokens", "cached_tokens", "completion_tokens", "zipage_compactions",
           "zipage_kv_len")


def client_for(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key="none")


def ask(client, messages, max_tokens, min_tokens=0, **extra):
    """One chat completion -> (answer text, record of what the server reported)."""
    r = client.chat.completions.create(
        model="default", messages=messages, max_tokens=max_tokens, temperature=0,
        extra_body={"min_tokens": min_tokens, "return_meta_info": True, **extra})
    choice = r.choices[0]
    meta = (choice.model_extra or {}).get("meta_info") or {}
    details = r.usage.prompt_tokens_details
    return choice.message.content, {
        "prompt_tokens": r.usage.prompt_tokens,
        "completion_tokens": r.usage.completion_tokens,
        # SGLang leaves prompt_tokens_details out when nothing was cached (or without
        # --enable-cache-report); meta_info always carries the count.
        "cached_tokens": details.cached_tokens if details is not None else 0,
        "meta_cached_tokens": meta.get("cached_tokens"),
        "zipage_compactions": meta.get("zipage_compactions"),
        "zipage_kv_len": meta.get("zipage_kv_len"),
        "finish_reason": choice.finish_reason,
    }


def run_agent(url: str, tasks=TASKS, max_tokens: int = 128, min_tokens: int = 96,
              show: bool = True):
    """Run the conversation; return (messages, one record per turn)."""
    client = client_for(url)
    messages = [{"role": "system", "content": SYSTEM}]
    records = []
    if show:
        print("turn", *COLUMNS, sep="  ")
    for turn, task in enumerate(tasks, 1):
        messages.append({"role": "user", "content": task})
        answer, rec = ask(client, messages, max_tokens, min_tokens)
        messages.append({"role": "assistant", "content": answer})
        records.append(rec)
        if show:
            print(f"{turn:4}", *(f"{rec[c]:{len(c)}}" for c in COLUMNS), sep="  ")
            print("     ", answer[:100].replace("\n", " "), "...")
    return messages, records


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--min-tokens", type=int, default=96,
                    help="keep the small model reasoning at least this long (0: free)")
    a = ap.parse_args()
    run_agent(a.url, max_tokens=a.max_tokens, min_tokens=a.min_tokens)


if __name__ == "__main__":
    main()
