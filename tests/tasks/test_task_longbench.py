"""longbench_v2_cot: truncation, the answer rule, prompt provenance, pass 2 without the document."""

from __future__ import annotations

import hashlib

import pytest

from rf_eval.tasks import longbench_cot as lb


@pytest.mark.parametrize(
    "response, choice",
    [
        ("The correct answer is (B)", "B"),
        ("Reasoning... **The correct answer is (C)**.", "C"),  # asterisks are removed first
        ("The correct answer is D.", "D"),  # fallback without parentheses
        ("The correct answer is (A) or maybe The correct answer is (B)", "A"),  # first match
        ("the correct answer is (B)", None),  # case matters
        ("The correct answer is (E)", None),
        ("The answer is (B)", None),
        ("", None),
        ("The correct answer is *(B)*", "B"),
    ],
)
def test_extract_choice(response, choice):
    assert lb.extract_choice(response) == choice


def test_middle_cut_keeps_first_and_last_halves(tiny_llama):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)  # one token per ASCII character
    text = "".join(chr(65 + i % 26) for i in range(1000))
    assert lb.middle_cut(tok, text, 1000) == text
    cut = lb.middle_cut(tok, text, 101)
    assert cut == text[:50] + text[-51:]  # max//2 first, the rest last, as the official script
    assert lb.middle_cut(tok, text, 100) == text[:50] + text[-50:]


def test_templates_and_pass_two(task_data, tmp_path):
    items = lb.load_items(task_data["longbench"])
    item = items[0]
    cot, ans, info = lb.load_templates(None)
    assert info["prompt_wording"] == lb.UNOFFICIAL
    first = lb.fill_template(cot, item, item["context"])
    assert item["context"].strip() in first and "$" not in first
    second = lb.fill_template(ans, item, document=None, cot="step by step")
    assert "step by step" in second and item["question"] in second
    assert "BEGIN-0" not in second and item["context"][100:160] not in second
    # official files are read from the user's folder and hashed
    (tmp_path / "0shot_cot.txt").write_text("D: $DOC$ Q: $Q$ A: $C_A$ B: $C_B$ C: $C_C$ D: $C_D$")
    (tmp_path / "0shot_cot_ans.txt").write_text("Q: $Q$ R: $COT$")
    cot, ans, info = lb.load_templates(tmp_path)
    assert info["prompt_wording"] == "official"
    assert info["prompt_sha256"]["0shot_cot.txt"] == hashlib.sha256((tmp_path / "0shot_cot.txt").read_bytes()).hexdigest()
    with pytest.raises(lb.LongBenchDataError, match="prompts"):
        lb.load_templates(tmp_path / "missing")


def test_missing_data_names_the_option(tiny_llama, th):
    with pytest.raises(lb.LongBenchDataError, match='"data"'):
        th.load_task("longbench_v2_cot", {"pretrained": tiny_llama})


def test_requests_seeds_and_groups(task_data, tiny_llama, th):
    meta = {"pretrained": tiny_llama, "data": str(task_data["longbench"]), "max_prompt_tokens": 400}
    task = th.load_task("longbench_v2_cot", meta)
    assert task.config.task_alias == "longbench_v2_cot (unofficial wording)"
    task.set_fewshot_seed(0)
    task.build_all_requests()
    again = th.load_task("longbench_v2_cot", {**meta, "fill": "identity"})
    again.set_fewshot_seed(0)
    again.build_all_requests()
    for a, b in zip(task.instances, again.instances):
        assert a.request_type == "two_pass_generate"
        context, gen1, template2, gen2, opts = a.args
        assert gen1["max_gen_toks"] == 1024 and gen2["max_gen_toks"] == 128 and gen1["temperature"] == 0.1
        assert a.args == b.args  # the same prompts and per-item seeds for every arm
        assert context.startswith(lb.fill_template(lb.PROJECT_COT, a.doc, a.doc["context"])[:200])
        assert context.endswith(lb.fill_template(lb.PROJECT_COT, a.doc, a.doc["context"])[-200:])
        assert len(context) == 400  # cut in the middle to max_prompt_tokens (byte tokens)
        assert a.doc["context"][:40] not in template2
    doc = task.instances[1].doc  # hard, medium
    res = task.process_results(doc, [{"cot": "...", "response": f"The correct answer is ({doc['answer']})"}])
    assert res["acc"] == 1.0 and res["acc_hard"] == 1.0 and res["acc_easy"] is None and res["acc_medium"] == 1.0
    assert res["acc_domain_multi_document_qa"] == 1.0 and res["acc_domain_single_document_qa"] is None
    assert task.process_results(doc, [{"cot": "", "response": "no idea"}])["answered"] == 0.0


@pytest.mark.parametrize("api", [False, True])
def test_two_pass_seeds_reach_api_models_in_the_request(api):
    """API models get each pass's seed in the request body; in-process models through torch."""
    import torch
    from lm_eval.api.instance import Instance
    from lm_eval.api.model import LM
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    from rf_eval.tasks.request_types import two_pass_generate

    seen = []

    def generate_until(requests, disable_tqdm=False):
        seen.append((requests[0].args[1], torch.randint(0, 10**9, (1,)).item()))
        return ["The correct answer is (B)"]

    if api:
        lm = LocalCompletionsAPI(base_url="http://127.0.0.1:9/v1/completions", model="m", tokenizer_backend=None)
    else:
        lm = type("Plain", (LM,), {"loglikelihood": None, "loglikelihood_rolling": None,
                                   "generate_until": None})()
    lm.generate_until = generate_until
    gen = {"until": [], "max_gen_toks": 8, "do_sample": True, "temperature": 0.1}
    req = Instance("two_pass_generate", {}, ("ctx", gen, "Q $COT$", dict(gen), {"chat": False, "seeds": [11, 22]}), 0)
    out = two_pass_generate(lm, [req])
    assert out[0]["prompt_2"] == "Q The correct answer is (B)"
    (kw1, draw1), (kw2, draw2) = seen
    assert (kw1.get("seed"), kw2.get("seed")) == ((11, 22) if api else (None, None))
    assert "seed" not in gen  # the task's own gen_kwargs are not changed
    if api:
        payload = lm._create_payload("ctx", generate=True, gen_kwargs=dict(kw1), seed=lm._seed)
        assert payload["seed"] == 11 and lm._seed == 1234
    torch.manual_seed(11)
    assert draw1 == torch.randint(0, 10**9, (1,)).item()  # torch is seeded per pass for every model
