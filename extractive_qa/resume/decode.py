"""A checkpoint's pickles decoded into new plain values: the trial's own restricted decoder.

pickle's opcodes, but every global a pickle may name is an exact (module, name) pair mapped to a
checking constructor here -- never to the object it names -- and what those return are recipes
(arguments, checked), built into tensors and NumPy arrays only after the whole pickle decoded and
only inside new dicts, lists and tuples. Nothing the file holds is passed on as an object.
What a checkpoint of this trial holds: weights and the optimizer's state (torch tensors), every
rank's random state (NumPy's MT19937 key array, torch's byte state, Python's tuple), numbers,
strings, and the OrderedDicts torch saves module states in.

One idea: what a pickle may make, and the walk that builds it again -- the opcodes' memo checked
first, the allowed globals, the recipes they return and the rebuild that turns recipes into new
values are one contract, changed together.
"""

from __future__ import annotations

import collections
import io
import math
import pickle
import pickletools
import re
from typing import Any

import numpy as np
import torch

from extractive_qa.errors import ConfigError
from extractive_qa.resume.archive import Archive, refused

MAX_NODES = 5_000_000  # values in one decoded pickle (a BERT-large state has ~10^4)
MAX_DEPTH = 32

STORAGE_DTYPES = {
    "FloatStorage": torch.float32, "DoubleStorage": torch.float64, "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
    "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
}  # fmt: skip
# NumPy dtypes the RNG states use (MT19937's key is uint32), by their pickled names.
NUMPY_DTYPES = frozenset({"b1", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8"})
PLAIN = (type(None), bool, int, float, str, bytes)


class Recipe:
    """What the decoder makes instead of an object: the checked arguments of one, built only after
    the whole pickle decoded. Made only through the checking functions STATE_GLOBALS names (pickle's
    NEWOBJ needs a class, so it cannot skip their checks); pickle's BUILD always lands in
    __setstate__, which refuses unless the recipe expects exactly one state; no __dict__, so no
    attribute or method can be replaced."""

    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        raise ValueError(f"a state for a {type(self).__name__}, which takes none")


class StorageType(Recipe):
    __slots__ = ("dtype",)

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype


class Storage(Recipe):
    __slots__ = ("flat",)

    def __init__(self, flat: torch.Tensor) -> None:
        self.flat = flat


class TensorRecipe(Recipe):
    __slots__ = ("storage", "offset", "size", "stride")

    def __init__(self, storage: Storage, offset: int, size: tuple[int, ...], stride: tuple[int, ...]) -> None:
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride

    def build(self) -> torch.Tensor:
        flat = self.storage.flat
        return torch.empty(0, dtype=flat.dtype).set_(
            flat.untyped_storage(), self.offset, self.size, self.stride
        )


class DtypeRecipe(Recipe):
    __slots__ = ("code", "order")

    def __init__(self, code: Any, align: Any = False, copy: Any = True) -> None:
        if code not in NUMPY_DTYPES or type(align) is not bool or type(copy) is not bool:
            raise ValueError(f"numpy dtype {code!r}")
        self.code, self.order = code, None

    def __setstate__(self, state: Any) -> None:
        # (version, byte order, subarray, names, fields, elsize, alignment, flags) of a plain dtype
        if self.order is not None:
            raise ValueError("a second state for a numpy dtype")
        if not (isinstance(state, tuple) and 8 <= len(state) <= 9 and state[1] in ("<", "|", "=")
                and state[2:5] == (None, None, None)):  # fmt: skip
            raise ValueError("numpy dtype state")
        self.order = state[1]

    def build(self) -> np.dtype:
        if self.order is None:
            raise ValueError("numpy dtype without its state")
        return np.dtype(self.code).newbyteorder("<") if self.order != "|" else np.dtype(self.code)


class NdarrayType(Recipe):
    __slots__ = ()


class ArrayRecipe(Recipe):
    __slots__ = ("shape", "dtype", "raw")

    def __init__(self, kind: Any, shape: Any, code: Any) -> None:
        if not isinstance(kind, NdarrayType) or shape != (0,) or code != b"b":
            raise ValueError("numpy array reconstruction")
        self.shape, self.dtype, self.raw = None, None, None

    def __setstate__(self, state: Any) -> None:
        if self.raw is not None:
            raise ValueError("a second state for a numpy array")
        if not (isinstance(state, tuple) and len(state) == 5 and state[0] == 1):
            raise ValueError("numpy array state")
        _, shape, dtype, fortran, raw = state
        shape_ok = (
            isinstance(shape, tuple) and len(shape) <= 4 and all(type(n) is int and n >= 0 for n in shape)
        )
        if (
            not shape_ok
            or not isinstance(dtype, DtypeRecipe)
            or fortran is not False
            or type(raw) is not bytes
        ):
            raise ValueError("numpy array state")
        if len(raw) != math.prod(shape) * np.dtype(dtype.code).itemsize:
            raise ValueError("numpy array data of the wrong length")
        self.shape, self.dtype, self.raw = shape, dtype, raw

    def build(self) -> np.ndarray:
        if self.raw is None:
            raise ValueError("numpy array without its state")
        return np.frombuffer(self.raw, dtype=self.dtype.build()).reshape(self.shape).copy()


class ScalarRecipe(Recipe):
    __slots__ = ("dtype", "raw")

    def __init__(self, dtype: Any, raw: Any) -> None:
        if not isinstance(dtype, DtypeRecipe) or type(raw) is not bytes:
            raise ValueError("numpy scalar")
        if len(raw) != np.dtype(dtype.code).itemsize:
            raise ValueError("numpy scalar of the wrong length")
        self.dtype, self.raw = dtype, raw

    def build(self) -> Any:
        return np.frombuffer(self.raw, dtype=self.dtype.build())[0].item()


def _latin1(text: Any, encoding: Any) -> bytes:
    """_codecs.encode as pickle protocol 2 uses it for bytes: str -> latin-1 bytes, nothing else."""
    if type(text) is not str or encoding not in ("latin1", "latin-1"):
        raise ValueError("_codecs.encode other than bytes as latin-1")
    return text.encode("latin-1")


def _ordered_dict(*args: Any) -> collections.OrderedDict:
    if args not in ((), ([],)):
        raise ValueError("OrderedDict with arguments")
    return collections.OrderedDict()


def _rebuild_tensor(
    storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any, hooks: Any, metadata: Any = None
) -> TensorRecipe:
    """torch._utils._rebuild_tensor_v2's arguments, checked: a view that stays inside its storage."""
    dims_ok = (
        isinstance(size, tuple) and isinstance(stride, tuple) and len(size) == len(stride) <= 8
        and all(type(n) is int and 0 <= n < 1 << 40 for n in (*size, *stride))
    )  # fmt: skip
    if not isinstance(storage, Storage) or type(offset) is not int or offset < 0 or not dims_ok:
        raise ValueError("tensor with a bad storage, offset, size or stride")
    if type(requires_grad) is not bool or type(hooks) is not collections.OrderedDict or hooks:
        raise ValueError("tensor with hooks")
    if metadata not in (None, {}) or (metadata is not None and type(metadata) is not dict):
        raise ValueError("tensor with metadata")
    if math.prod(size) > 0:
        last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
        if last >= storage.flat.numel():
            raise ValueError("tensor reaching past its storage")
    return TensorRecipe(storage, offset, size, stride)


def _dtype(*args: Any) -> DtypeRecipe:
    return DtypeRecipe(*args)


def _reconstruct(*args: Any) -> ArrayRecipe:
    return ArrayRecipe(*args)


def _scalar(*args: Any) -> ScalarRecipe:
    return ScalarRecipe(*args)


_NUMPY_CORES = ("numpy.core.multiarray", "numpy._core.multiarray")
# Functions and shared stand-ins, never classes: NEWOBJ on a function is an error, so every recipe
# is made through its checks.
STATE_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): _ordered_dict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("_codecs", "encode"): _latin1,
    ("numpy", "ndarray"): NdarrayType(),
    ("numpy", "dtype"): _dtype,
    **{(core, "_reconstruct"): _reconstruct for core in _NUMPY_CORES},
    **{(core, "scalar"): _scalar for core in _NUMPY_CORES},
    **{("torch", name): StorageType(dtype) for name, dtype in STORAGE_DTYPES.items()},
}


class Decoder(pickle.Unpickler):
    """pickle's opcodes with globals limited to `allowed` (exact (module, name) pairs, each mapped
    to a checking constructor here, never to the named object) and tensor storages read from
    `archive` by key."""

    def __init__(
        self, data: bytes, where: str, allowed: dict[tuple[str, str], Any], archive: Archive | None
    ) -> None:
        super().__init__(io.BytesIO(data))
        self.where, self.allowed, self.archive = where, allowed, archive
        self.storages: dict[str, Storage] = {}
        self.storage_dtypes: dict[str, torch.dtype] = {}

    def find_class(self, module: str, name: str) -> Any:
        found = self.allowed.get((module, name))
        if found is None:
            raise refused(
                self.where,
                f"refers to {module}.{name}, which no checkpoint of this trial holds (it could run code)",
            )
        return found

    def persistent_load(self, pid: Any) -> Storage:
        if self.archive is None:
            raise ValueError("a persistent reference outside torch.save's archive")
        ok = isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
        if (
            not ok
            or not isinstance(pid[1], StorageType)
            or type(pid[2]) is not str
            or type(pid[4]) is not int
        ):
            raise ValueError("a storage reference of another form than torch.save's")
        kind, key, location, numel = pid[1], pid[2], pid[3], pid[4]
        if not isinstance(location, str) or not re.fullmatch(r"cpu|cuda(:[0-9]{1,3})?", location):
            raise ValueError(f"a storage on device {location!r}")
        if key in self.storages:
            if self.storage_dtypes[key] != kind.dtype or self.storages[key].flat.numel() != numel:
                raise ValueError(f"storage {key} referenced as two different types")
            return self.storages[key]
        member = f"data/{key}"
        if member not in self.archive.members:
            raise ValueError(f"storage {key} is not in the archive")
        itemsize = torch.empty(0, dtype=kind.dtype).element_size()
        info = self.archive.members[member]
        if numel < 0 or info.file_size != numel * itemsize:
            raise ValueError(f"storage {key} holds {info.file_size} bytes, not {numel} x {itemsize}")
        raw = bytearray(self.archive.read(member, info.file_size))
        flat = torch.frombuffer(raw, dtype=kind.dtype) if raw else torch.empty(0, dtype=kind.dtype)
        self.storages[key], self.storage_dtypes[key] = Storage(flat), kind.dtype
        return self.storages[key]


def decode(
    data: bytes, where: str, allowed: dict[tuple[str, str], Any], archive: Archive | None = None
) -> Any:
    """One pickle -> new plain objects (dicts, lists, tuples, numbers, strings, tensors, NumPy
    arrays), or ConfigError naming the file and what it held."""
    check_memo(data, where)
    decoder = Decoder(data, where, allowed, archive)
    try:
        raw = decoder.load()
    except ConfigError:
        raise
    except Exception as err:  # a damaged or foreign pickle: say so rather than let it through
        raise refused(
            where, f"is not a checkpoint pickle of this trial ({type(err).__name__}: {str(err)[:200]})"
        ) from None
    if archive is not None:
        unused = {n for n in archive.members if n.startswith("data/")} - {
            f"data/{k}" for k in decoder.storages
        }
        if unused:
            raise refused(
                where, f"holds {len(unused)} storage member(s) its pickle never uses ({sorted(unused)[0]})"
            )
    return Rebuild(where).value(raw, (), 0)


MEMO_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}
MEMO_GETS = {"GET", "BINGET", "LONG_BINGET"}


def check_memo(data: bytes, where: str) -> None:
    """pickle's memo indices against the opcodes before them, in one pass: the pickler numbers its
    memo 0, 1, 2, ..., so an index past the count of memo entries so far is a forgery -- and a
    6-byte LONG_BINPUT of 2^27 would make the C unpickler allocate a 2 GiB memo table."""
    entries = 0
    try:
        for opcode, arg, _ in pickletools.genops(data):
            if opcode.name == "MEMOIZE":
                entries += 1
            elif opcode.name in MEMO_PUTS:
                if not isinstance(arg, int) or not 0 <= arg <= entries:
                    raise refused(
                        where, f"stores memo entry {arg} after only {entries} (pickle numbers them)"
                    )
                entries += arg == entries
            elif opcode.name in MEMO_GETS and (not isinstance(arg, int) or not 0 <= arg < entries):
                raise refused(where, f"reads memo entry {arg}, which was never stored")
    except ConfigError:
        raise
    except Exception as err:  # genops' own errors: a truncated or foreign opcode stream
        raise refused(where, f"is not a checkpoint pickle of this trial ({str(err)[:200]})") from None


def shown_path(path: tuple[Any, ...]) -> str:
    """A value's place, built only for an error: [key][index]... (keys shortened)."""
    if not path:
        return "the top"
    parts = []
    for step in path:
        if isinstance(step, str) and step.startswith("."):
            parts.append(step)
        else:
            parts.append(f"[{short(step)}]")
    return "".join(parts)[:300]


def short(value: Any, width: int = 60) -> str:
    """repr() for an error message, never raising (an int of 5,000 digits has no repr) and short."""
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= width else text[: width - 3] + "..."


class Rebuild:
    """Walks what the decoder returned and builds it again from plain types: containers new,
    recipes turned into tensors and arrays, anything else refused. Bounded in depth and size."""

    def __init__(self, where: str) -> None:
        self.where, self.nodes = where, 0

    def value(self, node: Any, path: tuple[Any, ...], depth: int) -> Any:
        # `path` is a tuple of keys, formatted only for an error: building a string per item would
        # cost a planted list of 2 million items under an 8 MB key hours of CPU.
        self.nodes += 1
        if depth > MAX_DEPTH or self.nodes > MAX_NODES:
            raise refused(
                self.where,
                f"nests deeper or holds more than a checkpoint of this trial (at {shown_path(path)})",
            )
        kind = type(node)
        if kind in PLAIN:
            return node
        if kind is tuple or kind is list:
            return kind(self.value(item, (*path, i), depth + 1) for i, item in enumerate(node))
        if kind is dict or kind is collections.OrderedDict:
            out = kind()
            for key, item in node.items():
                if type(key) not in (str, int):
                    raise refused(self.where, f"has a key of type {type(key).__name__} at {shown_path(path)}")
                out[key] = self.value(item, (*path, key), depth + 1)
            if kind is collections.OrderedDict:
                self.attributes(node, out, path, depth)
            return out
        if kind in (TensorRecipe, ArrayRecipe, ScalarRecipe):
            try:
                return node.build()
            except Exception as err:  # a recipe left incomplete or inconsistent: refused, not raised
                raise refused(
                    self.where, f"has a damaged value at {shown_path(path)} ({short(err, 200)})"
                ) from None
        raise refused(
            self.where, f"holds a {kind.__name__} at {shown_path(path)}, which this trial never writes"
        )

    def attributes(
        self, node: collections.OrderedDict, out: collections.OrderedDict, path: tuple[Any, ...], depth: int
    ) -> None:
        """A module state_dict's `_metadata` (each module's version), the one attribute torch keeps
        on the OrderedDicts it saves."""
        extra = vars(node)
        if set(extra) - {"_metadata"}:
            raise refused(
                self.where, f"sets attribute(s) {short(sorted(map(short, extra)), 200)} at {shown_path(path)}"
            )
        if "_metadata" in extra:
            metadata = self.value(extra["_metadata"], (*path, "._metadata"), depth + 1)
            if not isinstance(metadata, dict) or not all(
                isinstance(k, str) and isinstance(v, dict) and all(isinstance(x, str) for x in v)
                for k, v in metadata.items()
            ):
                raise refused(
                    self.where, f"has a module version record of another form at {shown_path(path)}"
                )
            out._metadata = metadata  # type: ignore[attr-defined]
