"""Every use of Determined internals, each with its reason, in one place.

One idea: every reach past Determined's public API, so that each is read, justified and checked
against the installed version in one file rather than scattered where it is used.

Determined 0.38.1 is the final release, so these cannot move under us; still, each one is
checked against the installed version before use (`check_version`), so a different Determined
fails with a clear message instead of an AttributeError deep in training.

Cluster vs local: `cluster_trial()` is the one test. On a cluster, `det.pytorch.init()` ignores
`distributed=` and `exp_conf=` (pytorch/_trainer.py:339-363: it initialises the process group
itself and reads the config and `steps_completed` from the cluster info); locally we must pass
both and join the process group ourselves.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from extractive_qa.errors import ConfigError

logger = logging.getLogger("squad")

WRITTEN_FOR = "0.38.1"


class VersionError(ConfigError):  # a refused setup: one line, exit 2 (cli.boundary)
    pass


def check_version() -> None:
    import determined

    if determined.__version__ != WRITTEN_FOR:
        raise VersionError(
            f"det_internals.py relies on internals of determined=={WRITTEN_FOR}; found "
            f"determined=={determined.__version__}. Install determined=={WRITTEN_FOR} "
            "(requirements.txt) or re-check each use in det_internals.py against that version."
        )


def cluster_trial() -> Any:
    """The ClusterInfo of a trial container, or None for a local run."""
    import determined as det

    info = det.get_cluster_info()
    return info if info is not None and info.task_type == "TRIAL" else None


def experiment_config(info: Any) -> dict[str, Any]:
    # The master's config with every schema default filled. Determined marks `_config` private
    # ("not a stable API", _info.py:92) but offers no public accessor, and a script entrypoint
    # must apply the config itself (periods, aggregation, length).
    return dict(info.trial._config)


@contextlib.contextmanager
def resume_at(steps: int) -> Iterator[None]:
    """Local mode: make the trial controller continue at `steps` batches.

    In local mode Trainer.fit() always starts the controller at batch 0 (_trainer.py:168), so a
    resumed run would replay the data from the beginning. On a cluster the master passes the
    right count; locally we pass the checkpoint's, through the controller's constructor.
    """
    from determined import pytorch

    original = pytorch._PyTorchTrialController
    if steps == 0:
        yield
        return

    class Resuming(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["steps_completed"] = steps
            super().__init__(*args, **kwargs)

    pytorch._PyTorchTrialController = Resuming
    try:
        yield
    finally:
        pytorch._PyTorchTrialController = original


@contextlib.contextmanager
def local_gpus_torch_sees(on_cluster: bool) -> Iterator[None]:
    """Local mode: size the run by the GPUs torch can use, not by those nvidia-smi lists.

    Locally pytorch.init() counts GPUs with `determined.gpu.get_gpu_uuids()` (_trainer.py:354),
    which asks nvidia-smi: blind to CUDA_VISIBLE_DEVICES and to a CPU build of torch. With the
    GPUs hidden (`CUDA_VISIBLE_DEVICES= python3 train.py`, to train on the CPU) or a CPU torch on
    a GPU machine it would pick CUDA and fail moving the model there. pytorch.init() reads the
    function from the module at call time, so an empty list here makes the run a CPU run, as
    torch sees it. On a cluster the agent's allocation decides (cluster_info.gpu_uuids).
    """
    import torch
    from determined import gpu

    if on_cluster or torch.cuda.is_available():
        yield
        return
    original = gpu.get_gpu_uuids
    gpu.get_gpu_uuids = list  # no GPUs: list() == []
    try:
        yield
    finally:
        gpu.get_gpu_uuids = original


@contextlib.contextmanager
def collective_timeout(seconds: float | None) -> Iterator[None]:
    """On a cluster, give Determined's own init_process_group call a timeout.

    pytorch.init() joins the process group itself with torch's default timeout (30 minutes;
    _trainer.py:291-294), so a machine that drops off the network stalls every other rank that
    long. The call reads `dist.init_process_group` from the module at call time, so wrapping it
    here adds the timeout; a timeout the call already passes wins.
    """
    if seconds is None:
        yield
        return
    import datetime

    import torch.distributed as dist

    original = dist.init_process_group

    def with_timeout(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("timeout", datetime.timedelta(seconds=seconds))
        return original(*args, **kwargs)

    dist.init_process_group = with_timeout
    try:
        yield
    finally:
        dist.init_process_group = original


def stop_training() -> Exception:
    """What train_batch raises to end fit() at a batch boundary, with an exit checkpoint.

    The controller looks at stop requests (context.set_stop_requested, preemption) only after a
    reporting boundary (pytorch/_pytorch_trial.py:605-608), i.e. every scheduling_unit batches --
    minutes on a CPU. Its private _ShouldExit (pytorch/_trainer_utils.py:112), raised before a
    batch does any work, is caught by the controller's _run, which writes the exit checkpoint
    unless the latest one is current (_pytorch_trial.py:498-501); the batch is not counted, so a
    resumed run starts with it.
    """
    from determined import pytorch

    return pytorch._ShouldExit()


def quiet_shared_fs_selector_warning() -> None:
    """Drop the one warning every shared_fs restore prints to no purpose.

    The controller restores with restore_path() in its LocalWorkersShareDownload mode, which hands
    the storage manager a selector whether or not any worker asked for one (core/_checkpoint.py:
    631-648); shared_fs then warns "Ignoring partial checkpoint download from shared_fs" on every
    resume (common/storage/shared.py:200-204), although nothing is partial: every file is read in
    place. Other records of that logger pass."""
    logging.getLogger("determined.common.storage.shared").addFilter(_not_the_selector_warning)


def _not_the_selector_warning(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Ignoring partial checkpoint download from shared_fs")


def end_as_invalid_hp(context: Any) -> Exception:
    """What every rank raises to end the trial as an invalid hyperparameter, without an exit
    checkpoint (finite_guard: the weights it would save may hold NaN).

    det.InvalidHP raised in training makes the controller write an exit checkpoint first
    (pytorch/_pytorch_trial.py:502-506) -- of the very state that is refused -- and raised in the
    chief's save alone it leaves the other ranks waiting in the save's broadcast (:254). The
    controller's own answer to an InvalidHP during a checkpoint is this pair (:258-261): report the
    early exit (each rank does, as core.Context.__exit__ does; the master keeps the reason,
    master/internal/trial.go SetUserInitiatedEarlyExit), then its private _ShouldExit with
    skip_exit_checkpoint, which _run takes as a clean end (:498-501)."""
    from determined import core, pytorch

    context._core.train.report_early_exit(core.EarlyExitReason.INVALID_HP)
    return pytorch._ShouldExit(skip_exit_checkpoint=True)


def shared_fs_checkpoint(exp_conf: dict[str, Any], uuid: str) -> Path | None:
    """Where a cluster checkpoint lies inside this container, for shared_fs (and `directory`,
    its subclass) storage.

    Used to check DET_LATEST_CHECKPOINT before training. Determined's storage manager knows the
    path (`_base_path`, common/storage/shared.py) but exposes no accessor; cloud storage is only
    readable by downloading, so it returns None there.
    """
    from determined.common import constants, storage

    conf = exp_conf.get("checkpoint_storage") or {}
    if conf.get("type") not in ("shared_fs", "directory"):
        return None
    manager = storage.build(conf, container_path=constants.SHARED_FS_CONTAINER_PATH)
    return Path(manager._base_path) / uuid


@contextlib.contextmanager
def code_copy_that_keeps_the_state() -> Iterator[None]:
    """Determined's checkpoint begins by copying the project into code/ (pytorch/_pytorch_trial.py:1091,
    util.write_user_code: shutil.copytree, util.py:271) and only then writes the state. A file
    that breaks during training (a link whose target is unmounted, a file made unreadable) made
    copytree raise shutil.Error there, ending the run with the trained state unsaved. While this is
    active the copy's failures are named in one warning and the checkpoint goes on: code/ holds
    every file that could be copied, the state is written."""
    import shutil

    from determined import util

    original = util.write_user_code

    def write_user_code(path: Path, on_cluster: bool) -> None:
        try:
            original(path, on_cluster)
        except (shutil.Error, OSError) as err:
            failed = err.args[0] if isinstance(err, shutil.Error) and err.args else [(str(err), "", "")]
            named = "; ".join(f"{src}: {why}" for src, _, why in failed[:3])
            logging.getLogger("squad").warning(
                "the checkpoint's copy of the project (code/) left out %d file(s) (%s); the trained "
                "state is saved. Remove or repair them, or list them in .detignore.", len(failed), named,
            )  # fmt: skip

    util.write_user_code = write_user_code
    try:
        yield
    finally:
        util.write_user_code = original


def no_sync_unless_stepping(model: Any, batch_idx: int, aggregation_frequency: int) -> Any:
    """DDP's no_sync() for the batches that only accumulate gradients (aggregation_frequency > 1).

    DDP decides in *forward* whether the coming backward all-reduces. Determined 0.38 enters
    no_sync() around backward only (pytorch/_pytorch_context.py `_should_communicate_and_update`),
    so without this every batch still all-reduces (bench/aggregation.py measured it); with it, only
    the optimizer-step batches do. `model` is the trial's wrapped model (under torch.compile too).
    """
    import torch

    ddp = getattr(model, "_orig_mod", model)
    last_of_step = (batch_idx + 1) % aggregation_frequency == 0
    if last_of_step or not isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext()
    return ddp.no_sync()


def tensorboard_into(context: Any, directory: Path) -> None:
    """A local run's TensorBoard event files go to `directory` instead of torch's default, `runs/`
    under the working directory -- the project, where they piled up one folder per run. Locally
    det.pytorch.init calls core.init without a tensorboard_path (pytorch/_trainer.py:367), so
    core's DummyTrainContext holds None (core/_context.py:211, core/_train.py:306) and the trial
    context's writer is SummaryWriter(None) (pytorch/_pytorch_context.py:1024). The train
    context's `_tbd_directory` is what get_tensorboard_path returns (core/_train.py:342); set
    before the chief's first report opens the writer. On a cluster the master's TensorBoard
    storage is used and nothing here runs."""
    train = context._core.train
    if not hasattr(train, "_tbd_directory"):
        raise VersionError(f"Determined's train context has no _tbd_directory (written for {WRITTEN_FOR})")
    train._tbd_directory = directory


def restore_id(path: Path) -> str:
    """The storage id under which Determined restores a checkpoint directory outside its storage
    root: the absolute path. Its shared_fs storage manager (local runs and shared_fs clusters)
    finds a checkpoint at os.path.join(base_path, storage_id) (common/storage/shared.py:210), and
    os.path.join keeps an absolute second argument as it is, so the resume's private copy --
    outside any directory other users can write -- is restored where it lies."""
    if not path.is_absolute():
        raise ValueError(f"{path}: a restore id must be an absolute path")
    return str(path)


@contextlib.contextmanager
def restore_where_it_lies() -> Iterator[None]:
    """A cluster trial restores the resume's private copy from where it lies, whatever the storage.

    Determined restores the checkpoint handed to Trainer.fit through core.checkpoint.restore_path
    (pytorch/_pytorch_trial.py:444, core/_checkpoint.py:599), which asks the storage manager. For
    shared_fs an absolute id is the path itself (restore_id). S3 and GCS's CloudStorageManager
    (common/storage/cloud.py:12-23) would instead download the id as a key prefix into its temp
    directory and remove that directory afterwards: with the private copy's path as the id it
    finds nothing, and it would delete the copy. While this is active an absolute id -- only
    restore_id makes one; a master's ids are UUIDs -- is yielded as the path it names, on every
    rank alike (no collective is skipped by only some), and any other id goes to Determined as
    before."""
    from determined.core import _checkpoint

    original = _checkpoint.CheckpointContext.restore_path

    @contextlib.contextmanager
    def restore_path(self: Any, storage_id: str, *args: Any, **kwargs: Any) -> Iterator[Path]:
        if os.path.isabs(storage_id):
            yield Path(storage_id)
            return
        with original(self, storage_id, *args, **kwargs) as path:
            yield path

    _checkpoint.CheckpointContext.restore_path = restore_path
    try:
        yield
    finally:
        _checkpoint.CheckpointContext.restore_path = original


class SearcherStopWatch:
    """Learns whether the searcher has stopped this trial (adaptive ASHA's early stopping).

    Determined 0.38.1's master moves a trial its searcher stops to STOPPING_COMPLETED but sends
    the running allocation no signal for that state (master/internal/trial.go:760-779 signals
    only canceled/killed/errored; experiment.go:673 and trial.go:236 set the state), and
    Trainer.fit() exits only on preemption or a stop request. So the chief reads the trial's
    state with Determined's own API bindings (GET /api/v1/trials/{id}) at each training report.
    """

    def __init__(self, info: Any) -> None:
        from determined.common.api import authentication, certs

        self.trial_id = info.trial.trial_id
        cert = certs.default_load(info.master_url)
        self.session = authentication.login_from_task(info.master_url, cert=cert)

    def stopped(self) -> bool:
        from determined.common.api import bindings

        try:
            trial = bindings.get_GetTrial(self.session, trialId=self.trial_id).trial
        except Exception as err:  # the master may be restarting; ask again next report
            logger.warning("could not read the trial's state from the master (%s)", err)
            return False
        return trial.state == bindings.trialv1State.STOPPING_COMPLETED


def metric_reports(trial: Any, group: str) -> list[tuple[int, float, dict[str, Any]]]:
    """(steps_completed, end time in seconds, metrics) of each report of one group of a trial
    from the SDK (scaling.py report --master), with the end time to the microsecond.

    The SDK's TrialMetrics.end_time (trial.iter_metrics) is parsed by
    common/util.py:232-270 parse_protobuf_timestamp, which drops the sub-second part (a
    Python 3.10 workaround): a rate from end-time differences was off by up to a second per
    interval (a 1.9 s interval read as 1 s in tests/test_cluster.py). This reads the same
    stream through the same generated binding iter_metrics uses
    (common/experimental/trial.py:596-601, bindings.get_GetMetrics) with the trial's session
    (`_session`, private) and parses the time itself.
    """
    from determined.common.api import bindings

    key = "validation_metrics" if group == "validation" else "avg_metrics"  # metrics.py:39
    return [
        (m.totalBatches, rfc3339_seconds(m.endTime), dict((m.metrics or {}).get(key) or {}))
        for page in bindings.get_GetMetrics(trial._session, trialIds=[trial.id], group=group)
        for m in page.metrics
    ]


def rfc3339_seconds(text: str) -> float:
    """A protobuf JSON timestamp (RFC 3339: 0, 3, 6 or 9 fractional digits, Z or an offset) as
    POSIX seconds, keeping the fraction (Python 3.10's fromisoformat takes only 3 or 6 digits)."""
    import datetime
    import re

    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text)
    if m is None:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    whole = datetime.datetime.fromisoformat(m.group(1) + zone).timestamp()
    return whole + float("0." + (m.group(2) or "0"))


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


@functools.lru_cache(maxsize=8)
def _detignore_spec(root: Path, mtime: float) -> Any:
    """The matcher of root's .detignore (built once per file version: a walk asks per folder)."""
    from determined.common import detignore

    return detignore._build_detignore_pathspec(root)


def uploaded(root: Path, path: Path) -> bool:
    """Whether `path` (inside `root`) is part of what Determined uploads with the experiment and
    copies into every local checkpoint's code/: not excluded by root's .detignore. Determined's
    own matcher (common/detignore.py `_build_detignore_pathspec`, private), so the answer is
    the one its context reader and checkpoint copy give."""
    spec = _detignore_spec(root, _mtime(root / ".detignore"))
    relative = path.relative_to(root)
    for depth in range(1, len(relative.parts) + 1):
        part = Path(*relative.parts[:depth]).as_posix()
        if spec.match_file(part) or spec.match_file(part + "/"):
            return False
    return True
