import pytest

from shoal.configs import ConfigError, load_catalog, load_profile


def test_shipped_catalog_and_profile_load():
    spec = load_catalog().get("minilm")
    assert spec.dim == 384 and spec.max_seq_length == 256 and spec.normalize
    assert spec.resolve_path().endswith("model")
    profile = load_profile("cpu-local")
    assert profile.workers == 1 and profile.path.endswith("cpu-local.yaml")
    assert profile.torch_threads(cores=2) == 2


def test_unknown_model_and_profile_list_what_exists():
    with pytest.raises(ConfigError, match="unknown model 'nope'; the catalog has: .*minilm"):
        load_catalog().get("nope")
    with pytest.raises(ConfigError, match="unknown profile 'nope'; shipped profiles: .*cpu-local"):
        load_profile("nope")


def test_bad_catalog_entry_names_file_and_field(tmp_path):
    path = tmp_path / "cat.yaml"
    path.write_text("models:\n  broken:\n    kind: embedder\n    source: /x\n    dim: -3\n    max_seq_length: 8\n")
    with pytest.raises(ConfigError, match=r"cat\.yaml: dim: Input should be greater than 0"):
        load_catalog(path)
    path.write_text("models:\n  broken:\n    kind: embeder\n    dim: 3\n    max_seq_length: 8\n")
    with pytest.raises(ConfigError, match=r"cat\.yaml: kind:"):
        load_catalog(path)
    path.write_text("models: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_catalog(path)


def test_bad_profile_field(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("workers: 0\nprefetch: 2\nsurprise: 1\n")
    with pytest.raises(ConfigError, match=r"p\.yaml: workers: .*surprise: Extra inputs"):
        load_profile(str(path))


def test_missing_source_directory_is_clear(tmp_path):
    path = tmp_path / "cat.yaml"
    path.write_text(
        f"models:\n  mine:\n    kind: embedder\n    source: {tmp_path}/absent\n    dim: 3\n    max_seq_length: 8\n"
    )
    with pytest.raises(ConfigError, match="model 'mine': source directory .*absent.* does not exist"):
        load_catalog(path).get("mine").resolve_path()


def test_profile_token_budget_override(tmp_path):
    path = tmp_path / "tuned.yaml"
    path.write_text("token_budgets:\n  minilm: 2048\n")
    tuned = load_profile(str(path)).tuned(load_catalog().get("minilm"))
    assert tuned.budget_for("cpu") == tuned.budget_for("cuda") == 2048


def test_in_process_workers_run_one_worker(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("workers: 2\nin_process_workers: true\n")
    with pytest.raises(ConfigError, match=r"p\.yaml: .*in_process_workers runs one worker; .*workers: 2"):
        load_profile(str(path))
