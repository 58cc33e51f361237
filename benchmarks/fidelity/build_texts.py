#!/usr/bin/env python3
"""Rebuild texts/ from the two packages it was cut from (provenance; the benchmark itself
only reads the committed texts/ files and needs neither package).

Sources (both public, both offline once fetched with their registry's ordinary client):
  jargon-text 4.4.7-4.1 (Debian): the Jargon File 4.4.7, public domain.
      apt-get download jargon-text
  champ-dataset 1.0.0 (PyPI): CHAMP math problems with step-by-step solutions, MIT licence.
      pip download --no-deps champ-dataset==1.0.0

  .venv/bin/python benchmarks/fidelity/build_texts.py \
      --jargon-deb jargon-text_4.4.7-4.1_all.deb --champ-wheel champ_dataset-1.0.0-py3-none-any.whl

Writes texts/texts.json (the teacher-forced texts, see TEXTS.md),
texts/champ_numeric.jsonl (CHAMP problems whose answer is a number, for math_eval.py) and
sglang_zipage/calibration_texts.json: the texts the calibrated scorer's query statistics are
computed over (sglang_zipage/calibrate.py), disjoint from both: Jargon lexicon entries (the
benchmark uses essays only), CHAMP problems in neither file, and Python standard-library
source (code, for the domain check; the running interpreter's files).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import re
import subprocess
import tarfile
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "texts")

JARGON_LICENCE = ("Public domain. The Jargon File 4.4.7 (Eric S. Raymond, ed.): \"This document "
                  "(the Jargon File) is in the public domain, to be freely used, shared, and "
                  "modified.\" Shipped by Debian's jargon-text package "
                  "(/usr/share/doc/jargon-text/jargon.txt.gz).")
CHAMP_LICENCE = ("MIT. CHAMP dataset 1.0.0 (Copyright 2024 Yujun Mao, Yoon Kim, Yilun Zhou), "
                 "PyPI package champ-dataset, file champ_dataset/dataset_files/v0.json; "
                 "problem statements and the human-written step-by-step solutions.")

# (id, first heading line, heading line that ends the section)
JARGON_SECTIONS = [
    ("jargon-ch1-2-culture-slang", "Chapter 1. Hacker Slang and Hacker Culture", "Chapter 3."),
    ("jargon-ch5-writing", "Chapter 5. Hacker Writing Style", "Chapter 6."),
    ("jargon-ch6-8-email-speech", "Chapter 6. Email Quotes and Inclusion Conventions",
     "Chapter 9."),
    ("jargon-ch4-construction", "Chapter 4. Jargon Construction", "Chapter 5."),
    ("jargon-appA-hack", "The Meaning of ‘Hack’", "TV Typewriters"),
    ("jargon-appB-portrait", "Appendix B. A Portrait of J. Random Hacker", "Appendix C."),
]
CHAMP_CATEGORIES = ["Combinatorics", "Number-Theory", "Inequality", "Polynomial", "Sequence"]
MIN_CHARS = 7000  # about 1.6k tokens of SmolLM2's tokenizer for English
CALIBRATION_CHARS = 24000  # per domain: about 5-8k tokens
CALIBRATION_OUT = os.path.join(HERE, "..", "..", "sglang_zipage", "calibration_texts.json")
PSF_LICENCE = ("PSF License Agreement (Python Software Foundation License Version 2): the "
               "source of Python's standard library, copied from the interpreter that ran "
               "build_texts.py")
CODE_MODULES = ("textwrap", "heapq", "bisect")


def fetch(args):
    tmp = tempfile.mkdtemp(prefix="fidelity-src-")
    if not args.jargon_deb:
        subprocess.run(["apt-get", "download", "jargon-text"], cwd=tmp, check=True)
        args.jargon_deb = os.path.join(tmp, next(f for f in os.listdir(tmp) if f.endswith(".deb")))
    if not args.champ_wheel:
        subprocess.run(["pip", "download", "--no-deps", "-d", tmp, "champ-dataset==1.0.0"],
                       check=True)
        args.champ_wheel = os.path.join(tmp, next(f for f in os.listdir(tmp)
                                                  if f.startswith("champ") and f.endswith(".whl")))


def read_jargon(deb: str) -> str:
    """The plain-text Jargon File out of the .deb (an ar archive holding data.tar.*)."""
    data = open(deb, "rb").read()
    assert data[:8] == b"!<arch>\n"
    pos = 8
    while pos < len(data):
        name = data[pos:pos + 16].decode().strip()
        size = int(data[pos + 48:pos + 58].decode().strip())
        body = data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(body)) as tar:
                member = next(m for m in tar.getmembers() if m.name.endswith("jargon.txt.gz"))
                return gzip.decompress(tar.extractfile(member).read()).decode("utf-8")
    raise RuntimeError(f"{deb}: no data.tar member")


def reflow(block: str) -> str:
    """Undo the 3-space indent and 78-column wrapping: one line per paragraph. Paragraphs
    indented deeper (quotations, examples, verse) keep their line breaks."""
    paras, out = re.split(r"\n\s*\n", block.strip("\n")), []
    if paras and paras[0].strip() == "Table of Contents":  # drop it and its entries
        paras.pop(0)
        while paras and len(paras[0].strip()) < 60 and not paras[0].strip().endswith("."):
            paras.pop(0)
    for p in paras:
        lines = [l for l in p.split("\n") if l.strip()]
        if not lines:
            continue
        if all(re.match(r"^ {3}\S", l) for l in lines):
            out.append(" ".join(l.strip() for l in lines))
        else:
            out.append("\n".join(l[3:] if l.startswith("   ") else l for l in lines))
    return "\n\n".join(out)


def jargon_texts(deb: str):
    lines = read_jargon(deb).replace("\u00a0", " ").split("\n")  # no-break spaces
    texts = []
    for tid, head, stop in JARGON_SECTIONS:
        start = next(i for i, l in enumerate(lines) if l == head and i > 270)
        end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith(stop))
        body = "\n".join(lines[start + 1:end])
        # Chapter 4-style sub-headings are unindented lines: keep them as plain lines.
        text = head + "\n\n" + reflow(body)
        assert len(text) >= MIN_CHARS, (tid, len(text))
        texts.append(dict(id=tid, kind="english", title=head, source="Jargon File 4.4.7",
                          licence=JARGON_LICENCE, text=text))
    return texts


def read_champ(wheel: str):
    with zipfile.ZipFile(wheel) as z:
        return json.loads(z.read("champ_dataset/dataset_files/v0.json"))["problems"]


def champ_entry(k: int, p: dict) -> str:
    steps = "\n".join(s["_text"] for s in p["solution"]["steps"])
    return f"Problem {k}. {p['_text']}\nSolution.\n{steps}\nAnswer: {p['_answer']}"


def champ_texts(wheel: str):
    problems = read_champ(wheel)
    texts, numeric = [], []
    for cat in CHAMP_CATEGORIES + ["Mixed"]:
        if cat == "Mixed":  # the second half of each category, interleaved
            pool = [p for c in CHAMP_CATEGORIES for p in
                    [q for q in problems.values() if q["category"] == c][20:]]
            pool = pool[::7]
        else:
            pool = [q for q in problems.values() if q["category"] == cat]
        parts, ids, size = [], [], 0
        for p in pool:
            if size >= MIN_CHARS:
                break
            parts.append(champ_entry(len(parts) + 1, p))
            ids.append(p["identifier"])
            size += len(parts[-1]) + 2
        texts.append(dict(id=f"champ-{cat.lower()}", kind="math",
                          title=f"CHAMP {cat}: {len(ids)} problems with step-by-step solutions",
                          source="CHAMP 1.0.0 " + ", ".join(ids), licence=CHAMP_LICENCE,
                          text="\n\n".join(parts)))
    for p in problems.values():
        a = p["_answer"].strip()
        if re.fullmatch(r"-?\d+(/\d+)?", a):
            numeric.append(dict(id=p["identifier"], problem=p["_text"], answer=a))
    return texts, numeric


def calibration_texts(deb: str, wheel: str, used_champ: set):
    """One text per domain, disjoint from the benchmark's: prose, math, code."""
    lines = read_jargon(deb).replace("\u00a0", " ").split("\n")
    start = next(i for i, l in enumerate(lines) if l.startswith("   :(TM):"))
    prose, end = "", start
    while len(prose) < CALIBRATION_CHARS:
        end += 200
        prose = reflow("\n".join(lines[start:end]))
    parts, ids = [], []
    for p in read_champ(wheel).values():
        if p["identifier"] in used_champ or sum(map(len, parts)) >= CALIBRATION_CHARS:
            continue
        parts.append(champ_entry(len(parts) + 1, p))
        ids.append(p["identifier"])
    import importlib
    import inspect
    code = "\n\n".join(inspect.getsource(importlib.import_module(m)) for m in CODE_MODULES)
    return [
        dict(id="prose", source=f"Jargon File 4.4.7, lexicon entries (lines {start}-{end})",
             licence=JARGON_LICENCE, text=prose),
        dict(id="math", source="CHAMP 1.0.0 " + ", ".join(ids), licence=CHAMP_LICENCE,
             text="\n\n".join(parts)),
        dict(id="code", source="Python standard library: " + ", ".join(
            f"{m}.py" for m in CODE_MODULES), licence=PSF_LICENCE,
             text=code[:CALIBRATION_CHARS]),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jargon-deb")
    ap.add_argument("--champ-wheel")
    args = ap.parse_args()
    fetch(args)
    texts = jargon_texts(args.jargon_deb)
    math, numeric = champ_texts(args.champ_wheel)
    os.makedirs(OUT_DIR, exist_ok=True)
    with open(os.path.join(OUT_DIR, "texts.json"), "w") as f:
        json.dump(texts + math, f, indent=1, ensure_ascii=False)
    with open(os.path.join(OUT_DIR, "champ_numeric.jsonl"), "w") as f:
        for r in numeric:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    used = {i for t in math for i in t["source"].split(" ", 2)[2].split(", ")}
    used |= {r["id"] for r in numeric}
    calibration = calibration_texts(args.jargon_deb, args.champ_wheel, used)
    with open(CALIBRATION_OUT, "w") as f:
        json.dump(calibration, f, indent=1, ensure_ascii=False)
    for t in texts + math:
        print(f"{t['id']:28s} {len(t['text']):6d} chars  {t['title']}")
    print(f"{len(numeric)} numeric-answer problems")
    for t in calibration:
        print(f"calibration {t['id']:8s} {len(t['text']):6d} chars  {t['source'][:60]}")


if __name__ == "__main__":
    main()
