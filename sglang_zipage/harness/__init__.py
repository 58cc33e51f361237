"""What every benchmark and e2e test needs, once (as SGLang keeps ``sglang/test/test_utils.py``
inside its package): a benchmark script under ``benchmarks/`` holds only its own workload, its
summary and its CLI, and imports the rest from here by package name.

  server   launch ``python -m sglang_zipage.launch_server`` on a free port, stop its process
           tree; the strict-memory and offline environments
  probe    read a running Engine or server: ``/server_info`` (its ``zipage`` state),
           ``/v1/loads``, ``/metrics``; wait until it is idle
  engines  the model folders (the 2-layer tiny Qwen3) and the keywords of a stock or zipage
           ``sglang_zipage.Engine`` on dummy weights; the engine flags of the CLIs
  loads    seeded prompts, the first-wave loads, the streaming client that drives an Engine
  windows  time series of samples: one sample taker, one window statistic, one progress line
  record   what a result file records: command, git commit, versions, GPU; atomic JSON write
  merge    single-engine result files side by side (first-wave and steady-state)
  fidelity the fidelity benchmark's reference implementation, metrics and texts
  docs_*   the docs' generated tables and figures (benchmarks/make_docs.py): throughput pairs
           (docs_tables), GPU and CPU evidence (docs_evidence, docs_cpu), flags (docs_flags),
           SVG figures (docs_figures), and which block goes in which page (docs_pages)

Import-light on purpose: a benchmark that starts an Engine is re-imported by SGLang's
spawned processes, so nothing here imports torch or sglang at module level.
"""
