"""The fidelity benchmark's pieces that its scripts (benchmarks/fidelity/) and the smoke test
(tests/unit/test_fidelity_smoke.py) share: the HF reference (``hf_reference``, a plain
transformers decode loop with per-head top-k eviction, and ``selection``, the ranking written
from the algorithm's description), ``metrics`` (NLL ratio, top-1 agreement, bootstrap) and
``texts`` (the committed texts cut into prompt and reference)."""
