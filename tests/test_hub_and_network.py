"""Hub names where the hub cannot be reached: one clear error within seconds, or the cached copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.project import run_train


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens once it is closed: connections are refused


def test_an_unreachable_hub_is_one_clear_error_or_the_cached_copy(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub name the hub cannot serve: the error comes from one probe, names the field, the
    reason and HF_HUB_OFFLINE, and no retry is printed; a model in the Hugging Face cache loads
    from there instead."""
    import shutil

    from extractive_qa.config import model_family
    from tests.support.project import tiny_config, write_yaml

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # read at import
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    model_family.hub_unreachable.cache_clear()
    conf = tiny_config(tiny_bert, tmp_path)
    conf["data"]["pretrained_model"] = "some-org/tiny-qa"
    path = write_yaml(conf, tmp_path / "exp.yaml")
    args = ["--config", str(path), "--checkpoint-dir", str(tmp_path / "c"), "--batches", "2"]
    code, _, err = run_train(args)
    assert code == 2 and "data.pretrained_model 'some-org/tiny-qa'" in err, err[-2000:]
    assert "did not answer" in err and "HF_HUB_OFFLINE=1" in err
    assert "Traceback" not in err and "etry" not in err  # no retry messages
    # The same name, downloaded before: the cached snapshot is used without the network.
    snapshot = tmp_path / "hub" / "models--some-org--tiny-qa" / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_bert, snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    model_family.hub_unreachable.cache_clear()
    code, result, err = run_train(args)
    assert code == 0, err[-2000:]
    assert result["steps_completed"] == 2
