"""torch.save's archive and a checkpoint's records, read strictly: plain files of bounded size,
opened without following a link or waiting on a pipe; the zip's directory checked before a byte of
data is read -- torch.save's member names exactly (no case variants, NUL bytes or second copies),
stored never compressed (a member's size is its size on disk: no bombs), each member where its
own header says, none overlapping another.

Python's zipfile and torch's reader each have their own tolerances (a prefix before the archive, a
name cut at NUL, a case-insensitive lookup); an archive that only one of them would read as
intended is refused here, and what is read here is decoded (checkpoint_decode), never handed on.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import struct
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

from extractive_qa.errors import ConfigError
from extractive_qa.io import reading

MIB = 1 << 20
RECORD_LIMIT = 16 * MIB  # trial_state.pkl, metadata.json, experiment.json, load_data.json
PICKLE_LIMIT = 64 * MIB  # state_dict.pth's data.pkl: names, shapes, RNG states (KBs per rank)


CHECKPOINT_FILE = reading.Kind("checkpoint of this model", RECORD_LIMIT)  # limits are given per file


def refused(where: str, what: str) -> ConfigError:
    return ConfigError(f"{where}: {what}; refusing it. Resume only checkpoints this project wrote.")


# --------------------------------------------------------------------------------------------
# Files: plain, bounded, opened without following links or waiting on a pipe.
# --------------------------------------------------------------------------------------------


def not_owned(info: os.stat_result) -> str | None:
    """Why a file a resume decodes is not the user's own to trust, or None: it must belong to
    this user and be writable by no one else -- not by other users, and not by its group unless
    that group is this user's own (a user-private group, as a umask of 002 makes files). Determined
    makes shared_fs directories 0777: another user can then replace a file, never make it theirs."""
    if info.st_uid != os.getuid():
        return f"belongs to user {info.st_uid}, not to you"
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o002 or (mode & 0o020 and info.st_gid != os.getgid()):
        return f"can be changed by other users (mode {mode:o})"
    return None


def open_plain(path: Path, limit: int, shown: Path) -> BinaryIO:
    """`path` opened for reading if it is a regular file of at most `limit` bytes, never through a
    link (reading.open_regular: a FIFO, device or directory is refused without blocking), and this
    user's own (`not_owned`, checked on the file opened: the bytes read are the checked file's)."""
    try:
        file = reading.open_regular(path, CHECKPOINT_FILE, follow_links=False, limit=limit, shown=shown)
    except reading.MissingFile:
        raise ConfigError(
            f"{shown}: incomplete checkpoint, {path.name} is missing (not written by train.py, or the "
            "copy was cut short)."
        ) from None
    except reading.UnreadableFile as err:
        raise refused(str(shown), str(err).removeprefix(f"{shown}: ").rstrip(".")) from None
    if why := not_owned(os.fstat(file.fileno())):
        file.close()
        raise ConfigError(
            f"{shown}: {why}; a resume reads only files you own that no one else can change. Resume your "
            "own checkpoint, or copy this one first (`cp -r`) and resume the copy."
        )
    return file


def read_record(path: Path, shown: Path) -> bytes:
    with open_plain(path, RECORD_LIMIT, shown) as f:
        return f.read(RECORD_LIMIT + 1)


def parse_json(data: bytes, shown: Path) -> dict[str, Any]:
    """A JSON object with unique keys and finite numbers, or ConfigError naming the file."""
    try:
        value = reading.parse_json(data, shown, "checkpoint record")
    except reading.UnreadableFile as err:
        raise ConfigError(f"{err} The checkpoint is damaged.") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{shown}: damaged checkpoint record (not a JSON object).")
    return value


def steps_of(metadata: dict[str, Any], shown: Path) -> int:
    """metadata.json's steps_completed: a non-negative integer (not 2.5, true or -5)."""
    steps = metadata.get("steps_completed")
    if type(steps) is not int or steps < 0:
        raise ConfigError(
            f"{shown}: steps_completed is {steps!r}, not a count of batches (a non-negative integer); "
            "the checkpoint is damaged or was edited."
        )
    return steps


# --------------------------------------------------------------------------------------------
# torch.save's archive, read strictly.
# --------------------------------------------------------------------------------------------

# Every member torch.save writes (torch 2.3 and 2.13): the pickle, its tensor storages by key,
# and small format records. Byte-exact: no case variants, no NUL, no other names.
MEMBER = re.compile(
    r"(?P<prefix>[A-Za-z0-9_][A-Za-z0-9_.-]{0,63})/(?P<rest>data\.pkl|byteorder|version|"
    r"\.format_version|\.storage_alignment|\.data/serialization_id|\.data/version|"
    r"data/(?:0|[1-9][0-9]{0,8}))"
)
SMALL_MEMBER = 64  # bytes: byteorder, version and the other format records
LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # a zip local file header (30 bytes)


@dataclasses.dataclass
class Archive:
    """torch.save's zip, its members by name after the common prefix, each checked in place."""

    file: BinaryIO
    zip: zipfile.ZipFile
    members: dict[str, zipfile.ZipInfo]
    where: str

    def read(self, name: str, limit: int) -> bytes:
        info = self.members[name]
        if info.file_size > limit:
            raise refused(f"{self.where} ({info.orig_filename})", f"holds {info.file_size:,} bytes")
        try:
            with self.zip.open(info) as member:
                return member.read()
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            raise ConfigError(
                f"{self.where}: damaged checkpoint ({info.orig_filename}: {err}); resume from an "
                "earlier checkpoint or copy this one again."
            ) from None


def open_archive(file: BinaryIO, size: int, where: str) -> Archive:
    """The archive's directory, checked before any member is read: torch.save's names under one
    prefix, each once, stored uncompressed (a member's size is its size on disk: no bombs), each
    local header naming what the directory names, and no member overlapping another."""
    head = file.read(4)
    if head != b"PK\x03\x04":
        # torch.save writes the archive from byte 0; zipfile also finds one after a prefix,
        # and torch.load would unpickle such a prefix.
        raise refused(where, f"is not a torch.save archive from its first byte (starts {head!r})")
    file.seek(0)
    try:
        archive = zipfile.ZipFile(file)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
        raise ConfigError(
            f"{where}: damaged or truncated checkpoint ({err}); resume from an earlier checkpoint "
            "or copy this one again."
        ) from None
    infos = archive.infolist()
    members: dict[str, zipfile.ZipInfo] = {}
    prefixes = set()
    for info in infos:
        match = MEMBER.fullmatch(info.orig_filename)
        if match is None:
            raise refused(
                where, f"holds a member named {info.orig_filename!r}, which torch.save never writes"
            )
        prefixes.add(match["prefix"])
        if match["rest"] in members:
            raise refused(where, f"holds {info.orig_filename!r} twice")
        if (
            info.flag_bits & 0x1
            or info.compress_type != zipfile.ZIP_STORED
            or info.compress_size != info.file_size
        ):
            raise refused(
                where, f"member {info.orig_filename!r} is compressed or encrypted (torch.save stores)"
            )
        members[match["rest"]] = info
    if len(prefixes) > 1:
        raise refused(where, f"mixes members of {len(prefixes)} archives ({', '.join(sorted(prefixes))})")
    for name in ("data.pkl", "byteorder", "version"):
        if name not in members:
            raise refused(where, f"has no {name} member (not written by torch.save)")
    check_positions(file, archive, where)
    return Archive(file, archive, members, where)


def check_positions(file: BinaryIO, archive: zipfile.ZipFile, where: str) -> None:
    """Every member's local header names what the directory names, and its header and data lie
    between the previous member and the next, in order from byte 0 to the central directory."""
    ordered = sorted(archive.infolist(), key=lambda i: i.header_offset)
    if ordered[0].header_offset != 0:
        raise refused(where, "does not start with its first member")
    ends = [i.header_offset for i in ordered[1:]] + [archive.start_dir]
    for info, end in zip(ordered, ends, strict=True):
        file.seek(info.header_offset)
        header = file.read(LOCAL_HEADER.size)
        if len(header) != LOCAL_HEADER.size:
            raise ConfigError(f"{where}: damaged or truncated checkpoint (member {info.orig_filename}).")
        fields = LOCAL_HEADER.unpack(header)
        signature, method, name_length, extra_length = fields[0], fields[3], fields[9], fields[10]
        name = file.read(name_length)
        start = info.header_offset + LOCAL_HEADER.size + name_length + extra_length
        descriptor = end - (start + info.file_size)  # the data descriptor torch writes after data
        if signature != b"PK\x03\x04" or method != zipfile.ZIP_STORED or name != info.orig_filename.encode():
            raise refused(where, f"member {info.orig_filename!r}'s own header says otherwise")
        if not 0 <= descriptor <= 24:
            raise refused(where, f"member {info.orig_filename!r} overlaps another or leaves a gap")
