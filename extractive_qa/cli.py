"""What every entry script shares before its own work: a Ctrl-C while the libraries load ends in
one line instead of a traceback, and command-line text that is not UTF-8 is named, not carried
into a tokenizer or a JSON file that cannot hold it.

Importing this module installs the interrupt hook, so the entry scripts import it first (torch
and transformers take seconds to load, and a Ctrl-C then lands inside some import). The process
still ends as one killed by SIGINT (Python re-raises it after the hook: exit status 130).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from types import TracebackType

INTERRUPTED_EARLY = "interrupted before any work started; nothing to keep."


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


def refuse_undecodable(argv: Sequence[str] | None) -> bool:
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
