"""rf-eval's cache folder and the caches a variable switches on."""

from rf_eval.files.cache_folder import CacheFolder, cache_root


def test_cache_root_respects_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("RF_EVAL_CACHE", str(tmp_path / "a"))
    assert cache_root() == tmp_path / "a"
    monkeypatch.delenv("RF_EVAL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_root() == tmp_path / "x" / "rf-eval"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "rf-eval"


def test_a_switched_cache_is_off_unless_named_and_on_for_children_at_the_default(monkeypatch, tmp_path):
    cache = CacheFolder("RF_EVAL_SOME_CACHE", "some")
    monkeypatch.setenv("RF_EVAL_CACHE", str(tmp_path / "root"))
    for value in ("", "off", "OFF", "0", "false", "no"):
        monkeypatch.setenv(cache.env, value)
        assert cache.folder_from_env() is None, value
    monkeypatch.setenv(cache.env, str(tmp_path / "mine"))
    assert cache.folder_from_env() == tmp_path / "mine"
    assert cache.child_env({}) == {cache.env: str(tmp_path / "root" / "some")}  # the default, under the root
    assert cache.child_env({cache.env: "off"}) == {cache.env: "off"}  # the user's choice stays
