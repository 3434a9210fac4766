"""Planted and damaged checkpoints: a resume decodes the checkpoint with the trial's own decoder,
checks it against the model and the run, and writes a new one that Determined restores -- so no
byte of the given files reaches torch.load or pickle.load. Each probe here is refused before any
training (exit 2, the file and what is wrong named, no traceback), or, where a user may mean it,
continues with a warning. All run in-process on the `trained` fixture's checkpoint.

One idea: every way a checkpoint given to a resume can be planted or wrong, against the one
decode-check-write path that refuses them.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import signal
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.project import run_train, trained_config

pytestmark = pytest.mark.cluster_stack  # the resume guard: torch.save, pickle and NumPy on both stacks


class Payload:
    """What a hostile checkpoint carries: unpickling it would create `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def copy_of(checkpoint: Path, tmp: Path, name: str = "copy") -> Path:
    target = tmp / name
    shutil.copytree(checkpoint, target)
    return target


def resume(checkpoint: Path, planted: Path, tmp: Path, *extra: str) -> tuple[int, dict | None, str]:
    """train.py --resume `planted` with the fixture's config, 2 batches past the checkpoint's 6."""
    args = ["--config", str(trained_config(checkpoint)), "--resume", str(planted), "--batches", "8",
            "--checkpoint-dir", str(tmp / "c"), *extra]  # fmt: skip
    return run_train(args)


def refused(code: int, err: str, *needles: str) -> None:
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    for needle in needles:
        assert needle in err, (needle, err[-3000:])


def nothing_written(tmp: Path) -> None:
    """No checkpoint trained and no private copy left behind."""
    storage = tmp / "c" / "determined"
    assert not list(storage.glob("*")) if storage.is_dir() else True


def rebuild_state(state: Path, members: Callable[[list[tuple[zipfile.ZipInfo, bytes]]], list]) -> None:
    """state_dict.pth with its members replaced by members(the originals): (name or ZipInfo, bytes)."""
    with zipfile.ZipFile(state) as src:
        items = [(info, src.read(info)) for info in src.infolist()]
    rebuilt = state.with_suffix(".new")
    with zipfile.ZipFile(rebuilt, "w") as dst:
        for name, data in members(items):
            dst.writestr(name, data)
    rebuilt.replace(state)


def pickle_member(items: list) -> tuple[zipfile.ZipInfo, bytes]:
    return next((i, d) for i, d in items if i.filename.endswith("/data.pkl"))


def replaced_pickle(items: list, data: bytes) -> list:
    genuine, _ = pickle_member(items)
    return [(i, data if i is genuine else d) for i, d in items]


def evil_pickle(marker: Path) -> bytes:
    return pickle.dumps({"state": Payload(marker)}, protocol=2)


# --------------------------------------------------------------------------------------------
# Code in a pickle: never run, whatever the archive does to hide it.
# --------------------------------------------------------------------------------------------


def archive_trick(kind: str, items: list, payload: bytes) -> list:
    """The three ways a scan and torch's reader were made to read different members."""
    genuine, data = pickle_member(items)
    prefix = genuine.filename[: -len("data.pkl")]
    others = [(i, d) for i, d in items if i is not genuine]
    if kind == "upper-case-name":  # the payload as .../data.PKL: torch finds it case-insensitively
        return [(prefix + "data.PKL", payload), *others]
    if kind == "second-copy":  # the genuine data.pkl, then DATA.PKL
        return [(genuine, data), *others, (prefix + "DATA.PKL", payload)]
    # nul-name: the payload as data.pkl first, the genuine one as "data.pkl\0y" (zipfile cuts at NUL)
    return [(prefix + "data.pkl", payload), *others, (prefix + "data.pklXy", data)]


@pytest.mark.parametrize("kind", ["upper-case-name", "second-copy", "nul-name"])
def test_archive_tricks_run_nothing_even_with_weights_only_off(
    kind: str, trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With torch.load unrestricted (as on the cluster image's torch 2.3), a payload hidden in
    state_dict.pth by member names never runs: the archive is refused by its names."""
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    checkpoint, _ = trained
    planted, marker = copy_of(checkpoint, tmp_path), tmp_path / "ran"
    state = planted / "state_dict.pth"
    rebuild_state(state, lambda items: archive_trick(kind, items, evil_pickle(marker)))
    if kind == "nul-name":  # same length, so only the name bytes change (CRCs cover data only)
        state.write_bytes(state.read_bytes().replace(b"data.pklXy", b"data.pkl\x00y"))
    code, _, err = resume(checkpoint, planted, tmp_path)
    refused(code, err, "state_dict.pth", "never writes" if kind != "second-copy" else "DATA.PKL")
    assert not marker.exists()
    nothing_written(tmp_path)


@pytest.mark.parametrize("name", ["trial_state.pkl", "state_dict.pth"])
def test_a_planted_pickle_is_refused_by_what_it_names(name: str, trained, tmp_path: Path) -> None:
    checkpoint, _ = trained
    planted, marker = copy_of(checkpoint, tmp_path), tmp_path / "ran"
    if name == "trial_state.pkl":
        (planted / name).write_bytes(evil_pickle(marker))
    else:
        rebuild_state(planted / name, lambda items: replaced_pickle(items, evil_pickle(marker)))
    code, _, err = resume(checkpoint, planted, tmp_path)
    refused(code, err, name, "system", "could run code")
    assert not marker.exists()
    nothing_written(tmp_path)


# pickle protocol 4: STACK_GLOBAL of ("numpy.dtypes", "__builtins__.get"), then a call: eval.
DOTTED = b"\x80\x04\x8c\x0cnumpy.dtypes\x94\x8c\x10__builtins__.get\x94\x93\x94\x8c\x04eval\x94\x85\x94R\x94."


@pytest.mark.parametrize("where", ["dotted-name", "pickle-before-the-zip"])
def test_pickles_that_pass_a_loose_scan_are_refused(where: str, trained, tmp_path: Path) -> None:
    checkpoint, _ = trained
    planted = copy_of(checkpoint, tmp_path)
    state = planted / "state_dict.pth"
    if where == "pickle-before-the-zip":
        state.write_bytes(DOTTED + state.read_bytes())
        assert zipfile.is_zipfile(state)  # zipfile (and torch) would still find the archive
    else:
        rebuild_state(state, lambda items: replaced_pickle(items, DOTTED))
    code, _, err = resume(checkpoint, planted, tmp_path)
    refused(code, err, "state_dict.pth", "first byte" if where != "dotted-name" else "__builtins__.get")


def test_the_loaders_read_only_bytes_the_rewrite_wrote(
    trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A genuine resume: every file torch.load and pickle.load read is one the rewrite wrote (by
    content), in the private copy, never the checkpoint the user named; the copy is gone after."""
    from extractive_qa.resume import rewrite as checkpoint_rewrite

    checkpoint, _ = trained
    mine = copy_of(checkpoint, tmp_path)
    written: set[str] = set()
    write_new = checkpoint_rewrite.write_new

    def recording(private: Path, *args: Any) -> None:
        write_new(private, *args)
        written.update(hashlib.sha256(p.read_bytes()).hexdigest() for p in private.iterdir() if p.is_file())

    loaded: list[tuple[Path, str, int]] = []
    torch_load, pickle_load = torch.load, pickle.load

    def seen(path: Path) -> None:
        mode = path.parent.stat().st_mode & 0o777
        loaded.append((path, hashlib.sha256(path.read_bytes()).hexdigest(), mode))

    def load_torch(f: Any, *args: Any, **kwargs: Any) -> Any:
        seen(Path(f))
        return torch_load(f, *args, **kwargs)

    def load_pickle(f: Any, *args: Any, **kwargs: Any) -> Any:
        if Path(getattr(f, "name", "")).name in ("trial_state.pkl", "workload_sequencer.pkl"):
            seen(Path(f.name))
        return pickle_load(f, *args, **kwargs)

    monkeypatch.setattr(checkpoint_rewrite, "write_new", recording)
    monkeypatch.setattr(torch, "load", load_torch)
    monkeypatch.setattr(pickle, "load", load_pickle)
    code, result, err = resume(checkpoint, mine, tmp_path)
    assert code == 0, err[-3000:]
    assert result["steps_completed"] == 8
    restored = [entry for entry in loaded if entry[0].name in ("state_dict.pth", "trial_state.pkl")]
    assert {p.name for p, _, _ in restored} == {"state_dict.pth", "trial_state.pkl"}
    from extractive_qa.resume.restore import private_root

    for path, digest, mode in restored:
        assert path.parent.name.startswith("resume-") and path.parent.parent == private_root()
        assert mode == 0o700  # a directory only this user can enter
        assert digest in written  # bytes the rewrite wrote, not a copy of the user's file
        assert not path.parent.exists()  # removed after the run
    assert not list((tmp_path / "c" / "determined").glob("*resume-*"))


def test_a_file_swapped_after_the_rewrite_is_never_read(
    trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window between reading and Determined's restore: a payload written into the user's
    checkpoint then must not run -- Determined restores the rewritten copy."""
    from extractive_qa.resume import restore as checkpoints

    checkpoint, _ = trained
    mine = copy_of(checkpoint, tmp_path)
    marker = tmp_path / "ran"
    rewrite = checkpoints.rewrite

    def rewrite_then_swap(*args: Any, **kwargs: Any) -> Any:
        done = rewrite(*args, **kwargs)
        (mine / "trial_state.pkl").write_bytes(evil_pickle(marker))  # the attacker's move
        return done

    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    monkeypatch.setattr(checkpoints, "rewrite", rewrite_then_swap)
    code, result, err = resume(checkpoint, mine, tmp_path)
    assert code == 0, err[-3000:]
    assert not marker.exists() and result["steps_completed"] == 8


# --------------------------------------------------------------------------------------------
# Well-formed pickles of the wrong content: named, not a traceback from Determined's restore.
# --------------------------------------------------------------------------------------------


def edited_state(checkpoint: Path, tmp: Path, edit: Callable[[dict], None]) -> Path:
    """A copy whose state_dict.pth holds the genuine state after `edit` (the test's own trusted
    torch.load of the fixture's file, then torch.save)."""
    planted = copy_of(checkpoint, tmp)
    state = torch.load(planted / "state_dict.pth", weights_only=False)
    edit(state)
    torch.save(state, planted / "state_dict.pth")
    return planted


def _moment(state: dict) -> None:
    moments = state["optimizers_state_dict"][0]["state"]
    first = moments[min(moments)]
    first["exp_avg"] = torch.zeros(3, 4)


def _rng(state: dict) -> None:
    state["rng_state"]["cpu_rng_state"] = torch.zeros(7, dtype=torch.uint8)


def _numpy_rng(state: dict) -> None:
    kind, key, *rest = state["rng_state"]["np_rng_state"]
    state["rng_state"]["np_rng_state"] = (kind, key[:10], *rest)


def _weights(state: dict) -> None:
    model = state["models_state_dict"][0]
    name = next(iter(model))
    model[name] = model[name][:1]


def _extra_key(state: dict) -> None:
    state["models_state_dict"][0]["planted.weight"] = torch.zeros(2)


def _callback_state(state: dict) -> None:
    state["callbacks"]["hf_export"] = {"anything": 1}


def _parameter(state: dict) -> None:  # a Parameter instead of a tensor: not what state_dict() saves
    model = state["models_state_dict"][0]
    name = next(iter(model))
    model[name] = torch.nn.Parameter(model[name])


def _negative_second_moment(state: dict) -> None:  # trained to NaN: Adam takes its square root
    moments = state["optimizers_state_dict"][0]["state"]
    moments[min(moments)]["exp_avg_sq"].view(-1)[0] = -1.0


def _schedule_step(state: dict) -> None:  # the first resumed rate is computed from it
    state["lr_schedulers_state_dict"][0]["last_epoch"] = -5


EDITS = {
    "negative-second-moment": (_negative_second_moment, "exp_avg_sq of"),
    "schedule-step-not-a-count": (_schedule_step, "last_epoch is -5"),
    "moment-of-the-wrong-shape": (_moment, "exp_avg of"),
    "bad-torch-rng-state": (_rng, "torch's random state"),
    "bad-numpy-rng-state": (_numpy_rng, "NumPy's random state"),
    "weight-of-the-wrong-shape": (_weights, "models_state_dict"),
    "weight-the-model-lacks": (_extra_key, "planted.weight"),
    "foreign-callback-state": (_callback_state, "hf_export"),
    "a-parameter-object": (_parameter, "_rebuild_parameter"),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_well_formed_but_wrong_state_is_named(edit: str, trained, tmp_path: Path) -> None:
    checkpoint, _ = trained
    change, needle = EDITS[edit]
    planted = edited_state(checkpoint, tmp_path, change)
    code, _, err = resume(checkpoint, planted, tmp_path)
    refused(code, err, "state_dict.pth", needle)
    nothing_written(tmp_path)


def _switched_options(state: dict) -> None:
    """Every option a saved parameter group can carry, set as a checkpoint could set it."""
    for group in state["optimizers_state_dict"][0]["param_groups"]:
        group.update(maximize=True, amsgrad=True, capturable=True, differentiable=True, fused="str",
                     foreach=False, weight_decay=5.0, betas=(0.5, 0.5), eps=0.5)  # fmt: skip
    state["lr_schedulers_state_dict"][0]["base_lrs"] = [0.5, 0.5]


def test_a_resume_takes_tensors_and_steps_not_options(trained, tmp_path: Path) -> None:
    """A checkpoint whose parameter groups switch the optimizer (uphill, AMSGrad, capturable, a
    `fused` string, other betas, decay, epsilon and peak rates) resumes exactly as the genuine one:
    the options are this run's. Before, torch took them: tracebacks, or training uphill, exit 0."""
    from safetensors.torch import load_file

    checkpoint, _ = trained
    results = []
    for name, edit in (("genuine", lambda state: None), ("switched", _switched_options)):
        planted = edited_state(checkpoint, tmp_path / name, edit)
        code, result, err = resume(checkpoint, planted, tmp_path / name)
        assert code == 0 and result is not None, err[-3000:]
        results.append(load_file(Path(result["checkpoint"]) / "hf" / "model.safetensors"))
    genuine, switched = results
    assert all(torch.equal(genuine[k], switched[k]) for k in genuine)


def _trial_state(checkpoint: Path, tmp: Path, state: Any) -> Path:
    planted = copy_of(checkpoint, tmp)
    (planted / "trial_state.pkl").write_bytes(pickle.dumps(state))
    return planted


def test_trial_state_and_metadata_are_checked(trained, tmp_path: Path) -> None:
    """An extra trial-state field, a directory where the file belongs, and steps_completed that
    is not a count or disagrees with the trial state: each named."""
    checkpoint, _ = trained
    genuine = pickle.loads((checkpoint / "trial_state.pkl").read_bytes())
    planted = _trial_state(checkpoint, tmp_path / "a", {**genuine, "extra": 1})
    refused(*resume(checkpoint, planted, tmp_path / "a")[::2], "trial_state.pkl", "extra")
    planted = copy_of(checkpoint, tmp_path, "dir")
    (planted / "trial_state.pkl").unlink()
    (planted / "trial_state.pkl").mkdir()
    refused(*resume(checkpoint, planted, tmp_path)[::2], "trial_state.pkl", "not a regular file")
    meta = json.loads((checkpoint / "metadata.json").read_text())
    for i, steps in enumerate([-5, 2.5, True, "6", 10**9]):
        planted = copy_of(checkpoint, tmp_path, f"steps-{i}")
        (planted / "metadata.json").write_text(json.dumps({**meta, "steps_completed": steps}))
        needle = "batches trained, metadata.json" if steps == 10**9 else "metadata.json: steps_completed"
        refused(*resume(checkpoint, planted, tmp_path)[::2], needle)
    planted = copy_of(checkpoint, tmp_path, "dup")
    text = (checkpoint / "metadata.json").read_text()
    (planted / "metadata.json").write_text(text.replace("{", '{"steps_completed": 1, ', 1))
    refused(*resume(checkpoint, planted, tmp_path)[::2], "metadata.json", "given twice")


def test_steps_beyond_the_run_are_refused_before_the_loader_skips_them(trained, tmp_path: Path) -> None:
    """steps_completed 10^9 written consistently (metadata.json and trial_state.pkl) would make
    Determined skip 10^9 batches of data before training; it is refused as nothing left to train."""
    checkpoint, _ = trained
    genuine = pickle.loads((checkpoint / "trial_state.pkl").read_bytes())
    planted = _trial_state(checkpoint, tmp_path, {**genuine, "batches_trained": 10**9})
    meta = json.loads((checkpoint / "metadata.json").read_text())
    (planted / "metadata.json").write_text(json.dumps({**meta, "steps_completed": 10**9}))
    refused(*resume(checkpoint, planted, tmp_path)[::2], "1000000000 batches", "nothing is left to train")
    nothing_written(tmp_path)


# --------------------------------------------------------------------------------------------
# Resources: refused from metadata, before a byte is read or copied.
# --------------------------------------------------------------------------------------------


def test_a_sparse_giant_state_is_refused_from_its_size(trained, tmp_path: Path) -> None:
    checkpoint, _ = trained
    planted = copy_of(checkpoint, tmp_path)
    os.truncate(planted / "state_dict.pth", 8 << 30)  # 8 GiB, sparse: no disk used
    code, _, err = resume(checkpoint, planted, tmp_path)
    refused(code, err, "state_dict.pth", "more than a checkpoint of this model holds")
    nothing_written(tmp_path)


def test_a_compressed_member_is_refused_before_it_is_inflated(trained, tmp_path: Path) -> None:
    """A zip bomb: 200 MB of zeros deflated to ~200 KB as data.pkl; refused from the archive's
    directory (torch.save stores, never compresses), never inflated."""
    checkpoint, _ = trained
    planted = copy_of(checkpoint, tmp_path)

    def bomb(items: list) -> list:
        genuine, _ = pickle_member(items)
        info = zipfile.ZipInfo(genuine.filename)
        info.compress_type = zipfile.ZIP_DEFLATED
        return [(info, bytes(200 << 20)) if i is genuine else (i, d) for i, d in items]

    rebuild_state(planted / "state_dict.pth", bomb)
    code, _, err = resume(checkpoint, planted, tmp_path)
    refused(code, err, "state_dict.pth", "compressed")


def test_a_symlink_planted_in_a_checkpoint_is_refused_not_followed(trained, tmp_path: Path) -> None:
    """state_dict.pth as a link to another file (another checkpoint, a secret): never opened."""
    checkpoint, _ = trained
    planted = copy_of(checkpoint, tmp_path)
    elsewhere = tmp_path / "elsewhere.pth"
    (planted / "state_dict.pth").rename(elsewhere)
    (planted / "state_dict.pth").symlink_to(elsewhere)
    code, _, err = resume(checkpoint, planted, tmp_path)
    refused(code, err, "state_dict.pth", "cannot be opened as a plain file")
    nothing_written(tmp_path)


def test_a_fifo_is_refused_without_waiting_for_a_writer(trained, tmp_path: Path) -> None:
    checkpoint, _ = trained
    planted = copy_of(checkpoint, tmp_path)
    (planted / "trial_state.pkl").unlink()
    os.mkfifo(planted / "trial_state.pkl")
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the resume waited on the FIFO"))
    signal.alarm(60)
    try:
        code, _, err = resume(checkpoint, planted, tmp_path)
    finally:
        signal.alarm(0)
    refused(code, err, "trial_state.pkl", "not a regular file")


def test_a_copy_left_by_a_killed_resume_is_named_and_removed(trained, tmp_path: Path, caplog) -> None:
    """A resume killed with -9 leaves its private copy; the next resume removes it (its owner
    lock is free) and says so. A live run's copy (its lock held) is kept, and so is a directory
    merely named like a copy (no owner record with a token), in the private root or in storage:
    the sweep removes only what it can prove a resume made."""
    import fcntl
    import secrets

    from extractive_qa.resume.restore import private_root

    checkpoint, _ = trained
    storage = tmp_path / "c" / "determined"
    storage.mkdir(parents=True)
    root = private_root()
    name = f"resume-test-{secrets.token_hex(4)}"
    dead, live, lookalike = root / f"{name}-dead", root / f"{name}-live", root / f"{name}-lookalike"
    renamed = storage / ".resume-old"  # a user's real checkpoint under an old copy's name
    for copy in (dead, live, lookalike, renamed):
        copy.mkdir(mode=0o700)
        (copy / "state_dict.pth").write_bytes(bytes(3 << 20))
    for copy in (dead, live):
        (copy / ".owner").write_text(f"{os.getuid()} {secrets.token_hex(16)}\n")
    (lookalike / ".owner").touch()
    held = os.open(live / ".owner", os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        with caplog.at_level("WARNING", logger="squad"):
            code, result, err = resume(checkpoint, copy_of(checkpoint, tmp_path), tmp_path)
    finally:
        os.close(held)
        for copy in (live, lookalike):
            shutil.rmtree(copy, ignore_errors=True)
    assert code == 0, err[-3000:]
    assert not dead.exists() and renamed.exists()
    assert f"removed {dead} (3 MB)" in caplog.text
    assert str(live) not in caplog.text and str(lookalike) not in caplog.text


# --------------------------------------------------------------------------------------------
# The private copy: where only its owner can write, checked again before Determined reads it.
# --------------------------------------------------------------------------------------------


def test_the_private_root_is_refused_when_others_can_write_to_it_or_above_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy made by name in a directory another user can write can be renamed away and
    replaced before Determined's pickle.load reads it (as in a 0777 shared_fs storage root). The
    private root is refused unless it and every directory above it are closed to other users."""
    import tempfile

    from extractive_qa.errors import ConfigError
    from extractive_qa.resume import restore as resume_module

    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)  # writable by all, not sticky
    monkeypatch.setattr(tempfile, "tempdir", str(open_dir))
    with pytest.raises(ConfigError, match="other users can write there"):
        resume_module.private_root()
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(closed))
    planted = closed / f"extractive-qa-{os.getuid()}"
    planted.mkdir(mode=0o777)
    planted.chmod(0o777)  # made before us, open to everyone
    with pytest.raises(ConfigError, match="not this user's alone"):
        resume_module.private_root()
    planted.rmdir()
    planted.symlink_to(open_dir)  # a link where the root belongs
    with pytest.raises(ConfigError, match="not this user's alone"):
        resume_module.private_root()
    planted.unlink()
    root = resume_module.private_root()
    assert root == planted and (root.stat().st_mode & 0o777) == 0o700


def test_a_copy_replaced_after_its_rewrite_is_refused_before_the_restore(
    trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The swap itself: the checked copy renamed away and a directory with a planted
    trial_state.pkl put under its name. The copy is checked (inode, owner, mode, its token)
    just before Determined reads it, so the planted pickle never runs."""
    from extractive_qa.resume import restore as resume_module

    checkpoint, _ = trained
    marker = tmp_path / "ran"
    prepare = resume_module.prepare_resume

    def prepare_then_swap(*args: Any, **kwargs: Any) -> Any:
        resumed = prepare(*args, **kwargs)
        private = resumed.copy
        moved = private.path.with_name(private.path.name + "-moved")
        private.path.rename(moved)
        shutil.copytree(moved, private.path)
        (private.path / "trial_state.pkl").write_bytes(evil_pickle(marker))
        return resumed

    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    monkeypatch.setattr(resume_module, "prepare_resume", prepare_then_swap)
    import extractive_qa.launch.local_run as local_run

    monkeypatch.setattr(local_run, "prepare_resume", prepare_then_swap)
    try:
        code, _, err = resume(checkpoint, copy_of(checkpoint, tmp_path), tmp_path)
    finally:
        for moved in resume_module.private_root().glob("resume-*-moved"):
            shutil.rmtree(moved, ignore_errors=True)
    refused(code, err, "was replaced after it was written")
    assert not marker.exists()


def test_sigterm_while_the_copy_is_written_says_so_and_removes_it(
    trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM during the decode used to end the process at once (143, no message) and leave
    the copy for the next resume; now one line, exit 143, and the copy is gone."""
    from extractive_qa.resume import restore as resume_module

    checkpoint, _ = trained
    rewrite = resume_module.rewrite
    made: list[Path] = []

    def terminated_midway(source: Path, private: Path, *args: Any, **kwargs: Any) -> Any:
        made.append(private)
        (private / "state_dict.pth").write_bytes(bytes(1 << 20))  # half-written
        os.kill(os.getpid(), signal.SIGTERM)
        return rewrite(source, private, *args, **kwargs)

    monkeypatch.setattr(resume_module, "rewrite", terminated_midway)
    code, _, err = resume(checkpoint, copy_of(checkpoint, tmp_path), tmp_path)
    assert code == 143 and "Traceback" not in err, err[-3000:]
    assert "terminated while checking the checkpoint to resume" in err
    assert made and not made[0].exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))


# --------------------------------------------------------------------------------------------
# The decoder's own costs and objects: linear in the file, nothing it made changeable.
# --------------------------------------------------------------------------------------------


def decode_refused(data: bytes, needle: str) -> None:
    from extractive_qa.errors import ConfigError
    from extractive_qa.resume.decode import STATE_GLOBALS, decode

    with pytest.raises(ConfigError, match=needle):
        decode(data, "trial_state.pkl", STATE_GLOBALS)


def test_a_memo_index_far_past_the_opcodes_is_refused_before_any_table_is_made() -> None:
    """LONG_BINPUT 2^27 in 6 bytes would make the C unpickler allocate a 2 GiB memo table."""
    decode_refused(b"\x80\x02N" + b"r" + (1 << 27).to_bytes(4, "little") + b".", "memo entry 134217728")
    decode_refused(b"\x80\x02" + b"h\x05" + b".", "never stored")


def test_pickle_build_and_newobj_on_the_decoders_own_stand_ins_are_refused() -> None:
    """BUILD on a shared stand-in (numpy.ndarray's) would change it for every later use; NEWOBJ
    on a checking constructor would skip its checks. Both are refused, never a traceback."""
    ndarray = b"\x80\x02cnumpy\nndarray\n"
    decode_refused(ndarray + b"}q\x00X\x01\x00\x00\x00aK\x01sb.", "takes none|not a checkpoint pickle")
    for name in (
        b"numpy\ndtype\n",
        b"numpy.core.multiarray\n_reconstruct\n",
        b"torch._utils\n_rebuild_tensor_v2\n",
    ):
        decode_refused(b"\x80\x02c" + name + b")\x81.", "not a checkpoint pickle")
    # A dtype given a second state after its checked one.
    dtype = b"\x80\x02cnumpy\ndtype\nX\x02\x00\x00\x00u4\x89\x88\x87R"
    state = b"(K\x03X\x01\x00\x00\x00<NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
    decode_refused(dtype + state + b"(K\x03X\x01\x00\x00\x00|NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb.",
                   "second state")  # fmt: skip


def test_a_long_list_under_a_long_key_is_decoded_in_linear_time() -> None:
    """One 8 MB key over a list of 2 million items: the error path is built only for an error, so
    walking it costs what the file's size costs (it was a string per item: ~30 min of CPU)."""
    import time

    from extractive_qa.resume.decode import STATE_GLOBALS, decode

    data = pickle.dumps({"k" * (8 << 20): [1] * 2_000_000}, protocol=2)
    start = time.perf_counter()
    decoded = decode(data, "trial_state.pkl", STATE_GLOBALS)
    assert len(next(iter(decoded.values()))) == 2_000_000
    assert time.perf_counter() - start < 30


def test_error_messages_about_planted_values_never_raise(trained, tmp_path: Path) -> None:
    """Keys of mixed types (sorting them raised TypeError) and an integer of 5,000 digits (its
    repr raises ValueError) are named in the refusal, not raised from it."""
    checkpoint, _ = trained
    planted = copy_of(checkpoint, tmp_path)
    state = {1: 0, "batches_trained": 10**5000}
    (planted / "trial_state.pkl").write_bytes(pickle.dumps(state, protocol=2))
    code, _, err = resume(checkpoint, planted, tmp_path)
    refused(code, err, "trial_state.pkl", "not Determined's trial state")
    nothing_written(tmp_path)


def test_a_nan_learning_rate_or_moment_is_refused(trained, tmp_path: Path) -> None:
    """An optimizer lr of NaN resumed, trained to F1 0 and wrote a NaN checkpoint."""
    checkpoint, _ = trained
    for change in ("lr", "moment"):
        planted = copy_of(checkpoint, tmp_path, f"nan-{change}")
        state = torch.load(planted / "state_dict.pth", weights_only=False)
        optimizer = state["optimizers_state_dict"][0]
        if change == "lr":
            optimizer["param_groups"][0]["lr"] = float("nan")
        else:
            moments = next(iter(optimizer["state"].values()))
            key = next(k for k, v in moments.items() if isinstance(v, torch.Tensor) and v.dim() > 0)
            moments[key].view(-1)[0] = float("inf")
        torch.save(state, planted / "state_dict.pth")
        code, _, err = resume(checkpoint, planted, tmp_path)
        refused(code, err, "state_dict.pth", "finite settings" if change == "lr" else "NaN or infinite")
        nothing_written(tmp_path)


@pytest.mark.parametrize("planted_file", ["state_dict.pth", "trial_state.pkl", "experiment.json"])
def test_a_resume_reads_only_files_you_own_that_no_one_else_can_change(
    planted_file: str, trained, tmp_path: Path, caplog
) -> None:
    """Determined makes a shared_fs checkpoint directory 0777: another user can replace a file of
    *your* checkpoint. A file the resume decodes that belongs to someone else, or that others can
    change, is refused naming it; `--resume auto` skips such a checkpoint for your own (none is
    left here: it starts afresh, saying what it skipped)."""
    import logging

    checkpoint, _ = trained
    storage = tmp_path / "c" / "determined"
    planted = copy_of(checkpoint, storage, checkpoint.name)
    planted.chmod(0o777)
    target = planted / planted_file
    target.chmod(0o666)  # anyone can rewrite it
    code, _, err = resume(checkpoint, planted, tmp_path)
    refused(code, err, planted_file, "can be changed by other users (mode 666)")
    target.chmod(0o644)
    if os.getuid() == 0:  # root can give the file to another user, as a planted one would be
        os.chown(target, 12345, 12345)
        code, _, err = resume(checkpoint, planted, tmp_path)
        refused(code, err, planted_file, "belongs to user 12345, not to you")
    else:
        target.chmod(0o646)
    caplog.set_level(logging.INFO)
    args = ["--config", str(trained_config(checkpoint)), "--resume", "auto", "--batches", "2",
            "--checkpoint-dir", str(tmp_path / "c")]  # fmt: skip
    code, result, err = run_train(args)
    assert code == 0, err[-3000:]
    assert "skipped 1 checkpoint(s)" in caplog.text and "no checkpoint of this run" in caplog.text, (
        caplog.text
    )
    assert result["steps_completed"] == 2  # trained from the start, not on the planted file
