"""The one reader (extractive_qa/io/reading.py): every file the project reads goes through it, and it
refuses what is not a regular file of its kind's size, and JSON that is not strictly JSON, with
one line naming the file -- never a hang, a whole /dev/zero read, or a traceback."""

from __future__ import annotations

import ast
import json
import os
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from extractive_qa.config.model_family import EMBEDDED_MODEL, resolve_pretrained
from extractive_qa.data.features import load_tokenizer
from extractive_qa.io import reading
from extractive_qa.io.files import ROOT

# --------------------------------------------------------------------------------------------
# No read outside the reader.
# --------------------------------------------------------------------------------------------

# Calls that read a file by themselves: Path.read_text / read_bytes / open(), builtin open() for
# reading, and the loaders that take a path or a file (json.load, np.load, pickle.load, torch.load).
# Parsing bytes already read (json.loads, yaml of text, an Unpickler over BytesIO) is not a read;
# the callers that parse a file's bytes use reading.parse_json.
PATH_READS = {"read_text", "read_bytes"}
LOADERS = {"json", "np", "numpy", "pickle", "torch"}


def shipped_files() -> list[Path]:
    return sorted([*ROOT.glob("*.py"), *(ROOT / "extractive_qa").rglob("*.py")])


def reads_outside_the_reader(path: Path) -> list[str]:
    relative = str(path.relative_to(ROOT))
    if relative == "extractive_qa/io/reading.py":
        return []
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "open":
            mode = (
                node.args[1]
                if len(node.args) > 1
                else next((k.value for k in node.keywords if k.arg == "mode"), None)
            )
            text = mode.value if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else "r"
            if not set(text) & set("wxa"):
                found.append(f"{relative}:{node.lineno}: open(..., {text!r})")
        elif isinstance(func, ast.Attribute):
            owner = func.value.id if isinstance(func.value, ast.Name) else ""
            if owner == "reading":
                continue
            if func.attr == "open" and owner not in ("os",):
                # Path.open() / Path.open("rb"); ZipFile.open(member) names a member, not a mode.
                mode = node.args[0] if node.args else ast.Constant("r")
                mode_text = mode.value if isinstance(mode, ast.Constant) else None
                if isinstance(mode_text, str) and set(mode_text) <= set("rbt"):
                    found.append(f"{relative}:{node.lineno}: .open({mode_text!r})")
            elif func.attr in PATH_READS or (func.attr == "load" and owner in LOADERS):
                call = f"{owner}.{func.attr}" if owner else func.attr
                found.append(f"{relative}:{node.lineno}: {call}()")
    return found


def test_every_file_the_project_reads_goes_through_the_one_reader() -> None:
    found = [line for path in shipped_files() for line in reads_outside_the_reader(path)]
    assert not found, "reads outside extractive_qa/io/reading.py:\n" + "\n".join(found)


def test_the_scan_finds_a_plain_read(tmp_path: Path) -> None:
    """The scan itself: a plain read in a shipped-looking file is found."""
    planted = ROOT / "extractive_qa" / "_planted_read_probe.py"
    planted.write_text("import json\n\ndef f(p):\n    return json.load(open(p))\n")
    try:
        assert len(reads_outside_the_reader(planted)) == 2
    finally:
        planted.unlink()


# --------------------------------------------------------------------------------------------
# What the reader refuses.
# --------------------------------------------------------------------------------------------


def test_a_fifo_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "metadata.json"
    os.mkfifo(fifo)
    with pytest.raises(reading.UnreadableFile, match="pipe, socket or device"):
        reading.read_json(fifo, reading.RECORD)


def test_a_link_to_dev_zero_is_refused_before_reading(tmp_path: Path) -> None:
    link = tmp_path / "config.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(reading.UnreadableFile, match="not a regular file"):
        reading.read_bytes(link, reading.DATA)


def test_a_sparse_file_over_the_limit_is_refused_from_its_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = tmp_path / "train.json"
    with open(big, "wb") as f:
        f.truncate(3 * reading.MIB)
    monkeypatch.setenv("EXTRACTIVE_QA_MAX_INPUT_MB", "2")
    with pytest.raises(reading.UnreadableFile, match="EXTRACTIVE_QA_MAX_INPUT_MB"):
        reading.read_bytes(big, reading.DATA)
    monkeypatch.setenv("EXTRACTIVE_QA_MAX_INPUT_MB", "4")
    assert len(reading.read_bytes(big, reading.DATA)) == 3 * reading.MIB


def test_a_directory_and_a_dangling_link_are_named(tmp_path: Path) -> None:
    with pytest.raises(reading.UnreadableFile, match="is a directory"):
        reading.read_bytes(tmp_path, reading.RECORD)
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    with pytest.raises(reading.MissingFile, match="link to a path that does not exist"):
        reading.read_bytes(tmp_path / "gone", reading.RECORD)


def test_a_link_is_refused_where_links_are_not_followed(tmp_path: Path) -> None:
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    assert reading.read_json(tmp_path / "link.json", reading.RECORD) == {}
    with pytest.raises(reading.UnreadableFile, match="symbolic link"):
        reading.read_json(tmp_path / "link.json", reading.RECORD, follow_links=False)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"steps_completed": Infinity}', "not a finite number"),
        ('{"steps_completed": NaN}', "not a finite number"),
        ('{"steps_completed": 1e999}', "beyond the range"),
        ('{"a": 1, "a": 2}', "given twice"),
        ("[   " * 200_000 + "]" * 200_000, "nested too deeply"),
        ('{"n": ' + "9" * 5000 + "}", "digits"),
        ("[" + "{}," * 100_000 + "{}]", "about 81 times that in memory"),  # 100,000 dicts: 20 MB from 300 KB
        ('{"qas": [{"id": "a\\ud800"}]}', r"lone surrogate \(\\ud800\) at qas\[0\]\.id,"),
        ("\xff", "not readable"),
    ],
)
def test_json_that_is_not_strictly_json_is_named(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "record.json"
    path.write_bytes(text.encode("latin-1") if text == "\xff" else text.encode())
    with pytest.raises(reading.UnreadableFile, match=needle) as caught:
        reading.read_json(path, reading.RECORD)
    assert str(path) in str(caught.value)
    assert json.loads('{"ok": 1.5}') == reading.parse_json(b'{"ok": 1.5}', "x")
    assert reading.parse_json('["\\ud83d\\ude00"]', "x") == ["\U0001f600"]  # a pair is one character


def test_a_small_file_is_read_without_a_buffer_the_size_of_the_limit(tmp_path: Path) -> None:
    # The data limit is 2 GiB; asking read() for that much allocates it (virtual memory that a host
    # with strict overcommit refuses), whatever the file holds.
    small = tmp_path / "dev.json"
    small.write_bytes(b"x" * 1000)
    tracemalloc.start()
    try:
        assert reading.read_bytes(small, reading.DATA) == b"x" * 1000
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < reading.MIB


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs Linux's /proc")
def test_a_file_that_holds_more_than_its_size_says_is_read_whole_and_bounded() -> None:
    # /proc's files say 0 bytes and hold more: the reader reads on past the metadata's size, up to
    # the limit, and refuses what is over it.
    cmdline = Path("/proc/self/cmdline")
    assert os.stat(cmdline).st_size == 0
    whole = reading.read_bytes(cmdline, reading.SYSTEM)
    assert len(whole) > 5 and whole.split(b"\0")[0]
    with pytest.raises(reading.UnreadableFile, match="grew past"):
        reading.read_bytes(cmdline, reading.SYSTEM, limit=5)


# --------------------------------------------------------------------------------------------
# Files a library reads by itself: a tokenizer's.
# --------------------------------------------------------------------------------------------


def tokenizer_dir(tmp_path: Path) -> Path:
    """The embedded model's tokenizer files in a directory of the test's own."""
    source = Path(resolve_pretrained(EMBEDDED_MODEL))
    model = tmp_path / "model"
    model.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        if (source / name).is_file():
            (model / name).write_bytes((source / name).read_bytes())
    return model


def test_transformers_reads_a_private_copy_of_the_tokenizer_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    model = tokenizer_dir(tmp_path)
    seen: dict[str, Any] = {}
    real = transformers.AutoTokenizer.from_pretrained

    def spy(path: str, **kwargs: Any) -> Any:
        seen["mode"] = os.stat(path).st_mode & 0o777
        seen["files"] = {p.name: p.read_bytes() for p in Path(path).iterdir()}
        return real(path, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", spy)
    tokenizer = load_tokenizer(str(model))
    assert seen["mode"] == 0o700, "transformers read a directory others can write to"
    assert seen["files"] == {p.name: p.read_bytes() for p in model.iterdir()}
    assert tokenizer.is_fast and tokenizer.name_or_path == str(model)


def test_a_tokenizer_file_over_its_limit_is_refused_by_name_before_transformers_reads_it(
    tmp_path: Path,
) -> None:
    model = tokenizer_dir(tmp_path)
    with open(model / "tokenizer.json", "wb") as f:
        f.truncate(reading.MODEL_FILE.bytes + reading.MIB)  # sparse: costs nothing unless read
    with pytest.raises(
        reading.UnreadableFile, match=r"tokenizer\.json: is 257\.0 MiB; more than a model file"
    ):
        load_tokenizer(str(model))


def test_a_regular_file_that_would_wait_is_refused_not_waited_on(tmp_path: Path) -> None:
    """/proc/kmsg is a "regular" file of size 0 whose read waits for the kernel's next message:
    data.py --convert /proc/kmsg hung. The reader keeps every file non-blocking, and a read that
    would wait is refused naming the file."""
    path = tmp_path / "f.json"
    path.write_text("{}")
    with reading.open_regular(path, reading.RECORD) as file:
        assert not os.get_blocking(file.fileno())
    read_end, write_end = os.pipe()  # a read that would wait, as /proc/kmsg's does
    os.set_blocking(read_end, False)
    with os.fdopen(read_end, "rb") as waiting, pytest.raises(BlockingIOError):
        reading._read_now(waiting, 10)
    os.close(write_end)


def test_a_path_that_is_no_file_says_where_it_looked_and_what_is_near(trained, tmp_path: Path) -> None:
    """ "squad_data: no such file" was all a user got for a directory given as a file, a near-miss
    name, or a path relative to the project typed in another directory."""
    from tests.support.project import run_main

    dry = ["train.py", "--config", "local.yaml", "--dry-run", "--set"]
    code, _, err = run_main([*dry, "data.train_file=squad_data"])
    assert code == 2 and "squad_data: is a directory, not a regular file (it holds " in err, err
    code, _, err = run_main([*dry, "data.train_file=squad_data/local-train-v1.json"])
    near = "relative paths start); did you mean squad_data/local-train-v1.1.json?"
    assert code == 2 and f"no such file in {ROOT}" in err and near in err, err
    checkpoint, _ = trained
    asked = ["predict.py", "--checkpoint", str(checkpoint), "--squad", "squad_data/dev-v1.1-excerpt.json"]
    code, _, err = run_main([*asked, "--out", str(tmp_path / "p.json")], cwd=tmp_path)
    assert code == 2 and f"no such file in {tmp_path} (the current directory); the project has" in err, err
