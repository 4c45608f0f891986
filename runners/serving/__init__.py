"""Serving: the engine and the recording proxy stood up together (`stack.serving`), the pool of proxy worker
processes over one shared engine server (`workers.WorkerPool`), and the event loop they serve on (`loop`).
Runs are stood up through `runners.placement`, which uses these."""
