"""Serving-engine arms: the reference backend behind an OpenAI-compatible server, and its clients.

- `arms`: the per-request arm (`rf_arm` body field or `/arm/<spec>/` URL prefix).
- `backend`: the model, one engine per arm, generation and prompt scoring.
- `app`: the FastAPI application (`rf-eval serve`).
- `client`: a small stdlib HTTP client for OpenAI-compatible servers.
- `timing`: the paper's time-to-first-token protocol (`rf-eval ttft`).
- `equivalence`: the cross-server equivalence check (`rf-eval check-equivalence --base-url`).

FastAPI and uvicorn come with the `serve` extra; only `app` imports them.
"""
