"""Host programs: stdlib-only modules that run on the GPU hosts, never importing controller or model code (a test
reads their imports). Delivered as one content-hashed bundle under ``~/.cache/specops/<hash>/`` and run as
``python3 run.py <module> ...``: ``probe_gpu`` (GPU probe and waits), ``signalling`` (guarded TERM/KILL),
``server_dir`` / ``server_ctl`` (server state, control), ``observe`` (GPUs and server status at once),
``transition`` (a whole server switch on the host), ``bench_ctl`` (benchmarks), ``lease`` (the host lock),
``engine_check`` (the host engine's own parser), ``common`` (shared helpers, the one secret rule).
"""
