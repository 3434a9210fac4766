"""Refuse a checkpoint whose pickles reference anything but what Determined and this trial write.

Determined unpickles a checkpoint's trial_state.pkl with plain `pickle.load`, and its
state_dict.pth with `torch.load`, which unpickles fully on torch < 2.6 (the default cluster
image's 2.3 among them) -- a planted checkpoint would run code as whoever resumes it. Before
Determined reads them, each pickle is walked by an unpickler whose `find_class` hands out inert
stand-ins for an allowlist of globals and refuses every other one: nothing the pickle names is
imported or called, and the refusal names the file and the global.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

from extractive_qa.settings import ConfigError

# What torch.save writes for this trial's state (weights, optimizer and scheduler state, every
# rank's RNG states as NumPy arrays and tensors); trial_state.pkl holds plain values only.
_NUMPY_CORES = ("numpy.core.multiarray", "numpy._core.multiarray")
ALLOWED_IN_STATE_DICT = frozenset(
    {
        ("collections", "OrderedDict"),
        ("_codecs", "encode"),
        ("torch._utils", "_rebuild_tensor_v2"),
        ("torch._utils", "_rebuild_parameter"),
        ("torch", "Size"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        *((core, "_reconstruct") for core in _NUMPY_CORES),
        *((core, "scalar") for core in _NUMPY_CORES),
    }
)
_TORCH_STORAGES = frozenset(
    f"{kind}Storage"
    for kind in (
        "Byte", "Char", "Short", "Int", "Long", "Half", "Float", "Double", "BFloat16", "Bool", "Untyped"
    )  # fmt: skip
)
_NUMPY_DTYPE_CLASSES = "numpy.dtypes"  # numpy 2 pickles dtypes by class (e.g. UInt32DType)


class _Inert:
    """What an allowed global becomes while scanning: accepts any call and state, does nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass


class _Scanner(pickle.Unpickler):
    def __init__(self, data: bytes, allowed: frozenset[tuple[str, str]], where: str) -> None:
        super().__init__(io.BytesIO(data))
        self.allowed, self.where = allowed, where

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.allowed or (
            self.allowed is ALLOWED_IN_STATE_DICT
            and ((module == "torch" and name in _TORCH_STORAGES) or module == _NUMPY_DTYPE_CLASSES)
        ):
            return _Inert
        raise ConfigError(
            f"{self.where}: refers to {module}.{name}, which no checkpoint of this trial contains; "
            "refusing to load it (it could run code). Resume only checkpoints this project wrote."
        )

    def persistent_load(self, pid: Any) -> Any:  # torch's tensor storages live beside the pickle
        return None


def scan(data: bytes, allowed: frozenset[tuple[str, str]], where: str) -> None:
    """Walk one pickle with every global checked; ConfigError if it is refused or unreadable."""
    try:
        _Scanner(data, allowed, where).load()
    except ConfigError:
        raise
    except Exception as err:  # a damaged pickle: say so rather than let Determined trip on it
        reason = f"{type(err).__name__}: {str(err)[:200]}"
        raise ConfigError(f"{where}: not a readable pickle ({reason}).") from None


def check_checkpoint_pickles(checkpoint: Path) -> None:
    """trial_state.pkl (plain values only) and state_dict.pth (the allowlist above)."""
    for name in ("trial_state.pkl", "workload_sequencer.pkl"):
        path = checkpoint / name
        if path.is_file():
            scan(path.read_bytes(), frozenset(), str(path))
    state = checkpoint / "state_dict.pth"
    if not state.is_file():
        return
    if zipfile.is_zipfile(state):  # torch.save's format: the pickle is the archive's data.pkl
        with zipfile.ZipFile(state) as archive:
            for member in archive.namelist():
                if member.endswith(".pkl"):
                    scan(archive.read(member), ALLOWED_IN_STATE_DICT, f"{state} ({member})")
    else:  # the legacy format: one pickle
        scan(state.read_bytes(), ALLOWED_IN_STATE_DICT, str(state))
