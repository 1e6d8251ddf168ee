"""Serving-engine arms: evaluate an approximate prefill in any OpenAI-compatible server, and time it.

Install: `pip install 'rf-eval[serve]'` (FastAPI, uvicorn, and lm-eval's API-model dependencies).

1. The reference backend behind an OpenAI-compatible API (`rf-eval serve`)::

       rf-eval serve --model MODEL [--fill ridge --maps MAPS --tail 4096] --port 8000
       rf-eval serve --model TARGET --model-args method=rarecache,source=SOURCE,maps=MAPS,rho=0.3

   The server is the method's lm-eval adapter (`ridgefill`, or `rarecache`
   with `method=rarecache`), built from the same model_args by the same code
   (`rf_eval.serving.backend`).
   Each request may run another arm on the same server start: body field
   `"rf_arm": {"fill": "identity", "tail": 256}`, or the URL prefix
   `/arm/fill=identity;tail=256/v1/completions` for clients that cannot add
   fields. Bad arm fields or values are HTTP 400 naming them and the valid
   ones. Responses carry `rf_arm` and `rf_timings` (server prompt time);
   every request is a JSON line in `--request-log`.

2. The generation protocols through lm-eval's API models. Send the prompt
   as tokens rendered by lm-eval itself, so that the prompt (and its
   `prompt_hash`) is the one `--model ridgefill` sees, and the filled-region
   subset comes from the tokenizer named in model_args and the `tail` in
   --metadata::

       lm_eval --model local-completions \\
           --model_args "model=M,tokenizer=MODEL,tokenizer_backend=huggingface,max_length=131072,base_url=http://127.0.0.1:8000/arm/fill=identity;tail=4096/v1/completions" \\
           --tasks ruler_filled --apply_chat_template \\
           --metadata '{"max_seq_lengths":[16384],"tail":4096,"protocol":"serving"}' \\
           --log_samples --output_path runs/serve_identity

   Give `max_length` (the model's context): lm-eval's API models otherwise
   cut every prompt to its last 2,047 tokens before sending it, while the
   task marks the needles in the whole prompt. Such a run pairs item by item with `lm_eval --model ridgefill
   --model_args pretrained=MODEL,fill=identity,tail=4096 ...` in `rf-eval
   report` (same doc and prompt hashes) and gives the same generations.
   `longbench_v2_cot` runs the same way. Prefer local-completions with
   --apply_chat_template: with local-chat-completions lm-eval sends the
   messages unrendered, so the needle marks of `ruler_filled` and the
   prompt hashes the report pairs on are not those of a rendered prompt.
   Chat messages the server renders itself (`/v1/chat/completions`) are
   rendered by the adapters' rule (`rf_eval.harness.chat`: enable_thinking=False
   where the template has the switch, as Qwen3's, unless the server's
   model_args set `enable_thinking` or `chat_template_args`) and the
   response's `rf_chat_template` records it as `rf_eval.chat_template`.
   lm-eval's local-completions renders on the client with the template's
   own default instead (thinking on for Qwen3; it takes no
   chat_template_args), so with such a template it does not pair with an
   adapter arm rendered with thinking off.
   A serving-engine fork (vLLM, llama.cpp) is evaluated the same way
   through its own OpenAI-compatible server, with its arm set by its own
   options. With lm-eval's in-process `vllm` model (`--model vllm
   --model_args pretrained=MODEL,...`), the tokenizer for the filled-region
   subset is `pretrained` and the fork's arm goes in its engine arguments;
   not tested here (no vLLM on CPU). Switch prefix caching off in such
   servers when timing them.

3. Time to first token by the paper's protocol (`rf-eval ttft`)::

       rf-eval ttft --base-url http://127.0.0.1:8000 --arm-a '{"fill":"exact"}' \\
           --arm-b '{"fill":"ridge","tail":2048}' --lengths 9216 16384 32768 \\
           --prompt chat_document.txt --repeats 5 --warmup 1 --out ttft.json

4. The equivalence check across servers (`rf-eval check-equivalence`)::

       rf-eval check-equivalence --base-url http://stock:8000 --base-url http://fork:8000 --prompts p.jsonl

5. Time to first token under Poisson load, RaReCache's serving protocol (section 4.6, appendix B.3;
   `rf-eval load`): the server's FCFS dynamic batching scheduler (`rf-eval serve --max-batch 32`) and
   a client that sends each sweep's requests at their Poisson arrivals::

       rf-eval load --base-url http://127.0.0.1:8000 --arm-a '{"fill":"exact"}' \
           --arm-b '{"fill":"ridge","tail":2048}' --lengths 4096 --rates 2 4 8 --saturation --out load.json

Modules: `arms` (per-request arm), `backend` (model, arms and the
scheduler's batches), `generation` (one request's generation after its
batch's prefills), `scheduler` (FCFS dynamic batching), `protocol`
(request/response bodies), `app` (FastAPI routes; the only module that
imports FastAPI), `answer` (a checked request's response, whole or streamed,
and the request log), `client` (stdlib HTTP client), `timing` (TTFT
protocol), `load` (TTFT under Poisson load), `inflight` (a load sweep's
requests in flight, cut at its deadline), `equivalence` (cross-server check).
"""
