"""The capture pass's unigram table (paper section 2.4): saved beside the maps, read by selectors."""

import torch

from rf_eval.ridge.maps import load_maps
from rf_eval.ridge.unigram import FILENAME, UnigramCounter, load_unigram
from rf_eval.ridgefill.fitting import fit_maps
from rf_eval.ridgefill.method import RidgeFill


def test_fit_saves_unigram_counts_beside_the_maps(tiny_model, tiny_model_dir, tmp_path):
    model, tok = tiny_model("llama")
    docs = ["Alpha beta gamma, the Zeta code 123.", "beta beta delta: Omega x9."]
    paths = []
    for i, text in enumerate(docs):
        path = tmp_path / f"cal{i}.txt"
        path.write_text(text)
        paths.append(str(path))
    out = tmp_path / "maps"
    fit_maps(model, tok, splits=[3], calibration=paths, lambdas=[0.03], out=out, progress=False)
    counts = load_unigram(out)
    assert (out / FILENAME).is_file() and counts.dtype == torch.int64
    want = torch.zeros_like(counts)
    for text in docs:
        for i in tok(text).input_ids:
            want[i] += 1
    assert torch.equal(counts, want)
    assert torch.equal(load_unigram(out / "ridgefill_split3.safetensors"), counts)  # from the map file's path

    rf = RidgeFill(model, tok, maps=out, tail=8, fill="ridge", selector="protected")
    assert rf.resources["unigram"] == str(out / FILENAME)
    ids = tok("Zeta Kappa omega QQ x9 and more words here ok", return_tensors="pt").input_ids
    result = rf.prefill(ids)
    assert result.exact_rows.numel() > 8
    assert rf.provenance()["selector"] == {"name": "protected", "rarest": 0.25, "unigram": None}
    # maps handed over already loaded (as the lm-eval adapter and `rf-eval serve` do) still find the table
    loaded = RidgeFill(model, tok, maps=load_maps(out, 3), tail=8, fill="ridge", selector="protected")
    assert loaded.resources["unigram"] == str(out / FILENAME)
    assert torch.equal(loaded.prefill(ids).exact_rows, result.exact_rows)
    from rf_eval.model_adapters import prefill_lm
    lm = prefill_lm.ridgefill(pretrained=tiny_model_dir("llama"), maps=str(out), fill="ridge", selector="probe(layers=0)", tail=8,
                     device="cpu")
    assert lm.method.resources["unigram"] == str(out / FILENAME)


def test_counter_grows_for_ids_past_its_size():
    counter = UnigramCounter(4)
    counter.add(torch.tensor([[1, 1, 6]]))
    assert counter.counts.tolist() == [0, 2, 0, 0, 0, 0, 1] and counter.documents == 1
