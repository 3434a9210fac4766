"""Where a checkpoint's model for answering is: a checkpoint directory train.py or a cluster wrote,
its hf/ export, a directory export.py wrote, or a Determined checkpoint UUID (downloaded through
the Determined SDK when a master is reachable).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from extractive_qa.errors import DataError
from extractive_qa.qa import qa_settings

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def find_hf_dir(checkpoint: str) -> Path:
    """The hf/ export inside a checkpoint (downloading a UUID through the Determined SDK)."""
    path = Path(checkpoint)
    if not path.exists() and UUID.match(checkpoint):
        path = download_checkpoint(checkpoint)
    if not path.is_dir():
        raise DataError(f"--checkpoint {checkpoint}: no such directory (or reachable UUID).")
    for candidate in (path / "hf", path):
        if (candidate / "config.json").is_file() and (candidate / qa_settings.QA_SETTINGS).is_file():
            return candidate
    raise DataError(
        f"--checkpoint {checkpoint}: not a checkpoint of this project (no hf/config.json and "
        "hf/qa_settings.json); pass a directory train.py wrote."
    )


def download_checkpoint(uuid: str) -> Path:
    from determined.experimental import client

    master = os.environ.get("DET_MASTER")
    if not master:
        raise DataError(
            f"--checkpoint {uuid}: looks like a Determined checkpoint UUID, but DET_MASTER is not "
            "set; set it (and log in with `det user login`) or pass a directory."
        )
    try:
        client.login(master=master)
        target = Path(tempfile.mkdtemp(prefix=f"ckpt-{uuid[:8]}-"))
        client.get_checkpoint(uuid).download(str(target))
    except Exception as err:  # the SDK raises many kinds; all mean "could not fetch"
        raise DataError(f"--checkpoint {uuid}: cannot download from {master} ({err}).") from None
    return target
