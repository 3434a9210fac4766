"""What every entry script shares before its own work: a Ctrl-C while the libraries load ends in
one line instead of a traceback, command-line text that is not UTF-8 is named, not carried into a
tokenizer or a JSON file that cannot hold it, and one boundary around each command's main
(`boundary`): whatever escapes it ends in one line and an exit status, never a traceback.

Importing this module installs the interrupt hook, so the entry scripts import it first (torch
and transformers take seconds to load, and a Ctrl-C then lands inside some import). The process
still ends as one killed by SIGINT (Python re-raises it after the hook: exit status 130).

Importing it also checks, before any other import, that the libraries the project runs on are
there (`REQUIRED`: found, not loaded): a Python without the project's venv is one line saying to
activate it or set it up (exit 2), never a ModuleNotFoundError traceback that leads a newcomer
to install torch into the system Python.
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from extractive_qa.errors import ConfigError, DataError, ScalingError, TrainingDiverged

# What every entry script imports before its own work (requirements.txt); found, not imported.
REQUIRED = ("torch", "transformers", "numpy", "yaml")
SETUP = (
    "python3 -m venv .venv && .venv/bin/pip install --no-deps torch==2.13.0 --index-url "
    "https://download.pytorch.org/whl/cpu && .venv/bin/pip install -r requirements.txt"
)


def missing_libraries(names: Sequence[str] = REQUIRED) -> list[str]:
    import importlib.util

    def found(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except ValueError:  # imported already, without a spec
            return True

    return [name for name in names if not found(name)]


def _require_libraries() -> None:
    if missing := missing_libraries():
        in_venv = sys.prefix != sys.base_prefix
        fix = (
            "install the project's requirements into it: pip install -r requirements.txt"
            if in_venv
            else f"activate the project's venv (. .venv/bin/activate), or set it up first: {SETUP}"
        )
        print(f"error: {', '.join(missing)} not installed for {sys.executable}; {fix}", file=sys.stderr)
        raise SystemExit(2)


_require_libraries()

INTERRUPTED_EARLY = "interrupted before any work started; nothing to keep."
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)  # only a write meets these
TRACEBACK_VARIABLE = "EXTRACTIVE_QA_TRACEBACK"  # set (to anything but 0): an internal error's traceback
INTERNAL = 1  # the exit status of an internal error; 2 is a refused input
TOO_DEEP = (
    "an input is nested too deeply to read (a file or value that contains itself, or thousands of "
    "levels deep); check the files and values given to this command"
)
TOO_LARGE = (
    "an input asks for more memory than this machine has; check the sizes and counts given to this "
    "command (batches, lengths, limits)"
)


def _quiet_interrupt(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        print(INTERRUPTED_EARLY, file=sys.stderr)
        return
    _previous(kind, value, tb)


_previous = sys.excepthook
if sys.excepthook is sys.__excepthook__:
    sys.excepthook = _quiet_interrupt

# A process started in the background by a script inherits SIGINT ignored, and Python keeps it
# so: a Ctrl-C or `kill -INT` during start-up (loading, a resume's checks) did nothing, while
# during training the run's own handler answers it (launch/interruption.py). Start-up answers too.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _refuse_undecodable(argv: Sequence[str] | None) -> bool:
    """Whether an argument (of `argv`, default sys.argv's) is not valid UTF-8 -- Python keeps such
    bytes as lone surrogates -- in which case the error line naming it is printed."""
    for position, arg in enumerate(sys.argv[1:] if argv is None else argv, start=1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            shown = arg.encode("utf-8", "backslashreplace").decode("ascii", "replace")[:80]
            print(
                f"error: argument {position} ({shown}) is not valid UTF-8 text; give it in UTF-8 "
                "(check the terminal's or the file's encoding).",
                file=sys.stderr,
            )
            return True
    return False


def hide_library_progress_bars() -> None:
    """transformers draws its own bar for every hf/ export ("Writing model shards") and model load
    ("Loading weights"); in a command's output they are noise, and a local run's progress lines say
    what is happening. Its warnings still print."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


Main = Callable[..., Any]  # an entry script's main: its exit status (None: 0)


def boundary(main: Main) -> Main:
    """The one boundary of an entry script's main: an argument that is not UTF-8 is refused before
    main runs (main's first argument, its argv, or sys.argv's), and what escapes main becomes one
    line on stderr.

    - a refused input (ConfigError, DataError, ScalingError, each naming its file or field): that
      message, exit 2;
    - an OSError: the path and the system's reason, exit 2;
    - an input too deep, too large or not UTF-8 (RecursionError, OverflowError, MemoryError,
      UnicodeError): what it is and what to check, exit 2;
    - anything else is this project's bug: one line saying so, exit 1, and its traceback with
      EXTRACTIVE_QA_TRACEBACK=1 (on a cluster, where the log is all there is, always).
    KeyboardInterrupt and SystemExit pass through (the interrupt hook and argparse answer them).
    """

    @functools.wraps(main)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        argv = args[0] if args else kwargs.get("argv")
        if _refuse_undecodable(argv if isinstance(argv, (list, tuple)) else None):
            return 2
        try:
            return main(*args, **kwargs)
        except (ConfigError, DataError, ScalingError, TrainingDiverged) as err:
            return _error(str(err))
        except BrokenPipeError:  # `| head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        except OSError as err:
            where = err.filename or "a file"
            if err.errno in WRITE_ERRNOS:  # outputs are written whole or not at all (files.py)
                return _error(f"cannot write {where}: {err.strerror}")
            return _error(f"{where}: {err.strerror or err}")
        except RecursionError:
            return _error(TOO_DEEP)
        except MemoryError:
            return _error(TOO_LARGE)
        except OverflowError as err:
            return _error(f"a number in the input is too large ({err}); check the numbers given to this "
                          "command and the records it reads")  # fmt: skip
        except UnicodeError as err:
            return _error(f"text that UTF-8 cannot hold ({_unicode_context(err)}); give the input in UTF-8")
        except Exception as err:
            if os.environ.get(TRACEBACK_VARIABLE, "0") not in ("", "0") or os.environ.get("DET_TASK_TYPE"):
                traceback.print_exc()
            first = str(err).splitlines()[0][:200] if str(err) else ""
            print(
                f"internal error: {type(err).__name__}: {first} -- a bug in this project, not in your input. "
                f"Run again with {TRACEBACK_VARIABLE}=1 to see where, and report it.",
                file=sys.stderr,
            )
            return INTERNAL

    return bounded


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _unicode_context(err: UnicodeError) -> str:
    """The offending characters and a little around them, escaped so the line itself prints."""
    text = getattr(err, "object", None)
    start = getattr(err, "start", 0)
    if isinstance(text, (str, bytes)):
        near = text[max(0, start - 20) : start + 20]
        shown = near.encode("utf-8", "backslashreplace") if isinstance(near, str) else near
        return f"near {shown.decode('ascii', 'backslashreplace')!r}"
    return str(err)
