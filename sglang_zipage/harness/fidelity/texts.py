"""The fidelity benchmark's texts (benchmarks/fidelity/texts/texts.json, listed in
benchmarks/fidelity/TEXTS.md) cut into token windows.

Every text becomes prompt = its first `prompt_len` tokens and reference = the next
`cont_len` tokens, so all texts share one length (the HF reference batches them and every
request compacts at the same steps). Free-running prompts: the chat template around the
first problem of each math text, and around an essay request on each English text's topic.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import List

from sglang_zipage.harness.record import REPO

TEXTS_DIR = os.path.join(REPO, "benchmarks", "fidelity", "texts")
TEXTS_JSON = os.path.join(TEXTS_DIR, "texts.json")
NUMERIC_JSONL = os.path.join(TEXTS_DIR, "champ_numeric.jsonl")


@dataclass
class Item:
    id: str
    kind: str  # english | math
    title: str
    prompt_ids: List[int]
    ref_ids: List[int]
    free_prompt_ids: List[int]
    free_prompt: str


def load_raw() -> List[dict]:
    with open(TEXTS_JSON) as f:
        return json.load(f)


def pick(raw: List[dict], n: int) -> List[dict]:
    """n texts alternating English and math (english first), in file order."""
    eng = [t for t in raw if t["kind"] == "english"]
    math = [t for t in raw if t["kind"] == "math"]
    out = []
    while len(out) < n and (eng or math):
        for pool in (eng, math):
            if pool and len(out) < n:
                out.append(pool.pop(0))
    return out


def free_request(t: dict) -> str:
    if t["kind"] == "math":
        first = t["text"].split("\nSolution.")[0]
        problem = first.split(". ", 1)[1] if first.startswith("Problem") else first
        return ("Solve the following problem step by step, then give the final answer in "
                f"\\boxed{{}}.\n\n{problem}")
    topic = t["title"].split(". ", 1)[-1]
    return f"Write a long, detailed essay about the following topic: {topic}."


def chat_ids(tok, user: str) -> List[int]:
    text = tok.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                   add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def load_items(tok, n_texts: int, prompt_len: int, cont_len: int,
               long_enough: bool = False) -> List[Item]:
    """n texts (pick) cut into prompt and continuation; ``long_enough``: picked from the texts
    of at least prompt_len + cont_len tokens only (else a shorter one is an error)."""
    raw = load_raw()
    ids_of = {t["id"]: tok(t["text"], add_special_tokens=False)["input_ids"] for t in raw}
    if long_enough:
        raw = [t for t in raw if len(ids_of[t["id"]]) >= prompt_len + cont_len]
    items = []
    for t in pick(raw, n_texts):
        ids = ids_of[t["id"]]
        if len(ids) < prompt_len + cont_len:
            raise ValueError(f"{t['id']}: {len(ids)} tokens < {prompt_len} + {cont_len}")
        user = free_request(t)
        items.append(Item(t["id"], t["kind"], t["title"], ids[:prompt_len],
                          ids[prompt_len:prompt_len + cont_len], chat_ids(tok, user), user))
    return items


def load_numeric_problems() -> List[dict]:
    with open(NUMERIC_JSONL) as f:
        return [json.loads(line) for line in f if line.strip()]
