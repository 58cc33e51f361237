"""A multi-turn reasoning agent on the OpenAI API of a zipage server.

    python -m sglang_zipage.launch_server --port 30000 --enable-cache-report \\
        --zipage-kv-budget 64 --zipage-buffer 16 &
    python examples/agent_multiturn.py --url http://127.0.0.1:30000

Plain OpenAI SDK code: every turn sends the whole conversation so far (system prompt,
earlier questions and the model's earlier answers) and asks for a long step-by-step answer.
Per turn it prints what the server reports:

- ``prompt_tokens`` and ``cached_tokens`` (``usage.prompt_tokens_details.cached_tokens``;
  SGLang fills it only when the server runs with ``--enable-cache-report``);
- ``zipage_compactions`` and ``zipage_kv_len`` from the response's ``meta_info``, which
  SGLang returns when the request sets ``return_meta_info`` (an SGLang extension).

With compression on, an answer that outgrew its KV budget is never inserted into SGLang's
radix tree (its KV is lossy), so the next turn's cache hit stops at the end of the previous
turn's prompt: ``cached_tokens`` of turn t+1 <= ``prompt_tokens`` of turn t (page-floored).
The small budget above makes that visible on a CPU; with the default budget (2048) answers
this short are never compressed and behave exactly as in stock SGLang.
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


def run_agent(url: str, tasks=TASKS, max_tokens: int = 160, min_tokens: int = 120,
              show: bool = True):
    """Run the conversation; return (messages, one record per turn)."""
    client = client_for(url)
    messages = [{"role": "system", "content": SYSTEM}]
    records = []
    for turn, task in enumerate(tasks, 1):
        messages.append({"role": "user", "content": task})
        answer, rec = ask(client, messages, max_tokens, min_tokens)
        messages.append({"role": "assistant", "content": answer})
        records.append(rec)
        if show:
            print(f"turn {turn}: prompt_tokens={rec['prompt_tokens']} "
                  f"cached_tokens={rec['cached_tokens']} "
                  f"completion_tokens={rec['completion_tokens']} "
                  f"zipage_compactions={rec['zipage_compactions']} "
                  f"zipage_kv_len={rec['zipage_kv_len']}")
            print("   ", answer[:160].replace("\n", " "), "...")
    return messages, records


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--min-tokens", type=int, default=120,
                    help="keep the small model reasoning at least this long (0: free)")
    a = ap.parse_args()
    run_agent(a.url, max_tokens=a.max_tokens, min_tokens=a.min_tokens)


if __name__ == "__main__":
    main()
