"""A stand-in for a Determined 0.38.1 master, for tests: the trial-facing REST API on loopback.

Not product code. It serves the model definition as `det experiment create` uploads it
(context_files), answers only the calls the harness and Determined's SDK make, parses every
request body with Determined's generated API types (a malformed or unknown call is recorded in
`Master.errors` and fails the test), records metrics, profiler samples and checkpoints, and can
preempt a trial or mark it stopped by the searcher. tests/support/det_cluster.py starts the containers
that talk to it.

One idea: the master's trial-facing API, every call the trial and the SDK make, answered from one
state.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import io
import json
import re
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from determined.common.api import bindings

from extractive_qa.config import experiment
from extractive_qa.io.files import ROOT

TASK_ID = "1.trial-1"


def context_files(root: Path) -> list[bindings.v1File]:
    """The model definition exactly as `det experiment create X.yaml <root>` uploads it:
    Determined's own reader (determined/common/context.py read_v1_context: .detignore through
    its pathspec matcher, the 96 MB limit)."""
    from determined.common import context

    with contextlib.redirect_stdout(io.StringIO()):  # its progress line
        return context.read_v1_context(root)


def context_tgz(root: Path) -> str:
    """The upload packed as the tgz the master serves to prep_container's
    --download_context_directory (GetTaskContextDirectory's b64Tgz)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for f in context_files(root):
            info = tarfile.TarInfo(f.path)
            info.type, info.mode, info.mtime = bytes([f.type]), f.mode & 0o7777, int(f.mtime or 0)
            content = base64.b64decode(f.content or "")
            info.size = len(content) if info.type == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(content) if info.size else None)
    return base64.b64encode(buf.getvalue()).decode()


def rfc3339(seconds: float) -> str:
    """A time as the master's JSON carries it (protobuf Timestamp: RFC 3339, UTC, microseconds)."""
    stamp = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    return stamp.isoformat(timespec="microseconds").replace("+00:00", "Z")


def api_error(code: int, message: str) -> dict[str, Any]:
    """An error body as the master's gRPC gateway writes it (common/api/errors.py reads it)."""
    return {"error": {"code": code, "reason": "stand-in", "error": message}}


def gateway_body(body: dict[str, Any], **path_params: Any) -> dict[str, Any]:
    """What the gRPC gateway decodes: path parameters merged in; proto field names (snake_case)
    accepted like their JSON names (camelCase). The harness posts a few bodies by hand
    (core/_train.py report_progress / report_early_exit) in snake_case."""

    def camel(key: str) -> str:
        head, *rest = key.split("_")
        return head + "".join(part.title() for part in rest)

    return {**{camel(k): v for k, v in body.items()}, **path_params}


# What Determined's system-metrics profiler reports under (core/_profiler.py: the collectors'
# `group`), through the same metrics endpoint as training and validation, with no step.
PROFILER_GROUPS = ("cpu", "gpu", "memory", "disk", "network")


@dataclass
class Checkpoint:
    uuid: str
    steps_completed: int
    metadata: dict[str, Any]
    resources: dict[str, str]


@dataclass
class ExperimentRecord:
    """A finished (or running, or failed) experiment of one trial, as the master's read API shows
    it to Determined's SDK: what `scaling.py report --master` reads."""

    id: int
    config: dict[str, Any]
    state: str  # an experimentv1State name: COMPLETED, ACTIVE, ERROR...
    trial_state: str  # a trialv1State name: COMPLETED, ACTIVE, ERROR...
    reports: list[dict[str, Any]]  # the trial's metric reports, as Master.metrics holds them

    @property
    def trial_id(self) -> int:
        return 1000 + self.id


class Lines(list):
    """A streamed answer: one JSON object per line (the gateway's server-streaming RPCs)."""


@dataclass
class Allocation:
    id: str
    containers: list[subprocess.Popen] = field(default_factory=list)
    preempt: bool = False
    acked: bool = False
    ended: float | None = None  # time.monotonic() when its last container exited


class Master:
    """The master's trial-facing REST API on loopback, for one experiment with one trial."""

    def __init__(self, context_dir: Path = ROOT, host: str = "127.0.0.1", netns: str | None = None) -> None:
        self.context_b64 = context_tgz(context_dir)
        self.experiment_id, self.trial_id = 1, 1
        self.trial_state = bindings.trialv1State.RUNNING
        self.metrics: list[dict[str, Any]] = []  # {group, steps_completed, metrics, trial_run_id}
        self.system_metrics: list[dict[str, Any]] = []  # the profiler's (profiling.enabled)
        self.checkpoints: list[Checkpoint] = []
        self.progress: list[float] = []
        self.early_exits: list[str] = []  # the reasons a trial reported (an invalid hyperparameter)
        self.calls: list[tuple[str, str]] = []
        self.errors: list[str] = []  # malformed or unknown calls: a test fails on any
        self.allocations: dict[str, Allocation] = {}
        self.rendezvous: dict[tuple[str, str], bindings.v1RendezvousInfo] = {}
        self.experiments: list[ExperimentRecord] = []  # what the SDK's read calls see
        # The experiment's checkpoint_storage as the SDK's get_checkpoint sees it (a Cluster sets
        # its shared_fs host_path); a download finds the checkpoint's files there.
        self.checkpoint_storage: dict[str, Any] = {}
        # A checkpoint's files as the master streams them when the SDK cannot reach the storage
        # itself (GET /checkpoints/UUID: a gzipped tar), by UUID.
        self.proxied: dict[str, bytes] = {}
        self.cond = threading.Condition()
        # Called with each metrics report before the trial gets its answer, so a test can act at
        # an exact step (flip the searcher's decision, kill a rank) without racing the trial.
        self.on_report: Callable[[dict[str, Any]], None] | None = None
        master = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _body(self) -> Any:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length) or b"null")

            def _send(self, code: int, obj: Any = None) -> None:
                kind = "application/json"
                if isinstance(obj, bytes):
                    data, kind = obj, "application/gzip"
                elif isinstance(obj, Lines):
                    data = "".join(json.dumps(line) + "\n" for line in obj).encode()
                else:
                    data = json.dumps({} if obj is None else obj).encode()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # caller gone
                    self.send_response(code)
                    self.send_header("Content-Type", kind)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def _dispatch(self, method: str) -> None:
                url = urlparse(self.path)
                master.calls.append((method, url.path))
                try:
                    body = self._body() if method in ("POST", "PATCH") else None
                    code, out = master.handle(method, url.path, parse_qs(url.query), body)
                except Exception as err:  # a body our bindings cannot parse: the call is wrong
                    master.errors.append(f"{method} {url.path}: {type(err).__name__}: {err}")
                    code, out = 400, api_error(3, str(err))
                self._send(code, out)

            def do_GET(self) -> None:
                self._dispatch("GET")

            def do_POST(self) -> None:
                self._dispatch("POST")

            def do_PATCH(self) -> None:
                self._dispatch("PATCH")

        if netns is None:
            self.server = ThreadingHTTPServer((host, 0), Handler)
        else:  # the listening socket lives in that namespace, whichever thread serves it
            from . import det_netns

            self.server = det_netns.call_in(netns, lambda: ThreadingHTTPServer((host, 0), Handler))
        self.server.daemon_threads = True
        self.host = host
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        with self.cond:
            for alloc in self.allocations.values():
                alloc.preempt = True  # release long polls
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()

    # ---- the API -------------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict, body: Any) -> tuple[int, Any]:
        b = bindings
        m = re.fullmatch
        if method == "GET" and (g := m(r"/api/v1/tasks/([^/]+)/context_directory", path)):
            return 200, b.v1GetTaskContextDirectoryResponse(b64Tgz=self.context_b64).to_json()
        if method == "POST" and m(r"/api/v1/allocations/[^/]+/acceleratorData", path):
            b.v1PostAllocationAcceleratorDataRequest.from_json(body)
            return 200, {}
        if method == "GET" and (g := m(r"/api/v1/allocations/([^/]+)/resources/([^/]+)/rendezvous", path)):
            info = self.rendezvous[(g.group(1), g.group(2))]
            return 200, b.v1AllocationRendezvousInfoResponse(rendezvousInfo=info).to_json()
        if method == "POST" and path == "/api/v1/runs/start":
            req = b.v1RunPrepareForReportingRequest.from_json(body)
            assert req.runId == self.trial_id, req.runId
            return 200, b.v1RunPrepareForReportingResponse(storageId=1).to_json()
        if method == "POST" and (g := m(r"/api/v1/trials/(\d+)/metrics", path)):
            req = b.v1ReportTrialMetricsRequest.from_json(body)
            assert int(g.group(1)) == req.metrics.trialId == self.trial_id
            report = {
                "group": req.group,
                "steps_completed": req.metrics.stepsCompleted,
                "metrics": dict(req.metrics.metrics.avgMetrics or {}),
                "trial_run_id": req.metrics.trialRunId,
                "time": time.time(),  # when the master received it, as it stores end_time
            }
            if req.group in PROFILER_GROUPS:  # the profiler's system metrics: no step, per agent
                with self.cond:
                    self.system_metrics.append(report)
                return 200, {}
            if self.on_report is not None:
                self.on_report(report)
            with self.cond:
                self.metrics.append(report)
                self.cond.notify_all()
            return 200, {}
        if method == "POST" and path == "/api/v1/checkpoints":
            ck = b.v1Checkpoint.from_json(body)
            # The master finds the trial from the task; training metadata is left empty.
            assert ck.taskId == TASK_ID and ck.allocationId in self.allocations, (ck.taskId, ck.allocationId)
            assert ck.state == b.checkpointv1State.COMPLETED, ck.state
            with self.cond:
                self.checkpoints.append(
                    Checkpoint(
                        ck.uuid, int(ck.metadata["steps_completed"]), dict(ck.metadata), dict(ck.resources)
                    )
                )
                self.cond.notify_all()
            return 200, {}
        if method == "GET" and (g := m(r"/api/v1/allocations/([^/]+)/signals/preemption", path)):
            alloc = self.allocations[g.group(1)]
            deadline = time.monotonic() + float(query.get("timeout_seconds", ["0"])[0])
            with self.cond:  # long poll, as the master does
                while not alloc.preempt and time.monotonic() < deadline:
                    self.cond.wait(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
                return 200, b.v1AllocationPreemptionSignalResponse(preempt=alloc.preempt).to_json()
        if method == "POST" and (g := m(r"/api/v1/allocations/([^/]+)/signals/ack_preemption", path)):
            # Posted with no body (core/_preempt.py:257): the gateway fills the path parameter.
            b.v1AckAllocationPreemptionSignalRequest.from_json(
                gateway_body(body or {}, allocationId=g.group(1))
            )
            self.allocations[g.group(1)].acked = True
            return 200, {}
        if method == "POST" and (g := m(r"/api/v1/trials/(\d+)/progress", path)):
            req = b.v1ReportTrialProgressRequest.from_json(gateway_body(body, trialId=int(g.group(1))))
            self.progress.append(req.progress)
            return 200, {}
        if method == "POST" and m(r"/api/v1/trials/\d+/runner/metadata", path):
            b.v1TrialRunnerMetadata.from_json(body)
            return 200, {}
        if method == "GET" and m(r"/api/v1/experiments/\d+/searcher/best_searcher_validation_metric", path):
            values = [r["metrics"].get("f1") for r in self.metrics if r["group"] == "validation"]
            values = [v for v in values if v is not None]
            if not values:
                return 404, api_error(5, "no validations yet")
            return 200, b.v1GetBestSearcherValidationMetricResponse(metric=max(values)).to_json()
        if method == "GET" and (g := m(r"/api/v1/trials/(\d+)", path)):
            trial = b.trialv1Trial(
                experimentId=self.experiment_id,
                hparams={},
                id=int(g.group(1)),
                restarts=0,
                startTime="2026-11-22T00:00:00Z",
                state=self.trial_state,
                totalBatchesProcessed=max([r["steps_completed"] for r in self.metrics] or [0]),
            )
            return 200, b.v1GetTrialResponse(trial=trial).to_json()
        if method == "POST" and m(r"/api/v1/trials/\d+/early_exit", path):
            # Every rank reports it; the master sets the trial's exit reason each time and answers
            # 200 (master/internal/trial.go, SetUserInitiatedEarlyExit).
            self.early_exits.append(b.v1TrialEarlyExit.from_json(gateway_body(body)).reason.value)
            return 200, {}
        if (answer := self.handle_read(method, path, query, body)) is not None:
            return answer
        self.errors.append(f"unexpected call {method} {path}")
        return 404, api_error(5, f"{method} {path}: not served by this stand-in")

    # ---- what the SDK reads (determined.experimental.client) --------------------------------

    def handle_read(self, method: str, path: str, query: dict, body: Any) -> tuple[int, Any] | None:
        b = bindings
        if method == "POST" and path == "/api/v1/auth/login":
            req = b.v1LoginRequest.from_json(body)
            user = b.v1User(active=True, admin=True, username=req.username, id=1)
            return 200, b.v1LoginResponse(token="user-token", user=user).to_json()
        if method == "GET" and (g := re.fullmatch(r"/api/v1/checkpoints/([^/]+)", path)):
            ck = next((c for c in self.checkpoints if c.uuid == g.group(1)), None)
            if ck is None:
                return 404, api_error(5, f"checkpoint not found: {g.group(1)}")
            training = b.v1CheckpointTrainingMetadata(
                experimentConfig={"checkpoint_storage": self.checkpoint_storage},
                experimentId=self.experiment_id,
                trialId=self.trial_id,
            )
            found = b.v1Checkpoint(
                uuid=ck.uuid, state=b.checkpointv1State.COMPLETED, resources=ck.resources,
                metadata=ck.metadata, training=training, reportTime=rfc3339(time.time()),
            )  # fmt: skip
            return 200, b.v1GetCheckpointResponse(checkpoint=found).to_json()
        if method == "GET" and (g := re.fullmatch(r"/checkpoints/([^/]+)", path)):  # a proxied download
            data = self.proxied.get(g.group(1))
            return (404, api_error(5, f"checkpoint not found: {g.group(1)}")) if data is None else (200, data)
        if method == "GET" and path == "/api/v1/me":  # the SDK checks a cached login's token
            return 200, b.v1GetMeResponse(
                user=b.v1User(active=True, admin=True, username="determined", id=1)
            ).to_json()
        if method == "GET" and path == "/api/v1/experiments":
            wanted = set(query.get("labels", []))
            exps = [e for e in self.experiments if not wanted or wanted & set(e.config.get("labels") or [])]
            offset = int(query.get("offset", ["0"])[0])
            page = b.v1Pagination(
                offset=offset, limit=len(exps), startIndex=offset, endIndex=len(exps), total=len(exps)
            )
            return 200, b.v1GetExperimentsResponse(
                experiments=[self._experiment(e) for e in exps[offset:]], pagination=page
            ).to_json()
        if method == "GET" and (g := re.fullmatch(r"/api/v1/experiments/(\d+)/trials", path)):
            exp = next(e for e in self.experiments if e.id == int(g.group(1)))
            page = b.v1Pagination(offset=0, limit=1, startIndex=0, endIndex=1, total=1)
            return 200, b.v1GetExperimentTrialsResponse(trials=[self._trial(exp)], pagination=page).to_json()
        if method == "GET" and path == "/api/v1/trials/metrics/trial_metrics":
            group, ids = query["group"][0], {int(i) for i in query["trialIds"]}
            key = (
                "validation_metrics" if group == "validation" else "avg_metrics"
            )  # as the master stores them
            reports = [
                b.v1MetricsReport(
                    archived=False,
                    endTime=rfc3339(r["time"]),
                    group=group,
                    id=n,
                    metrics={key: r["metrics"]},
                    totalBatches=r["steps_completed"],
                    trialId=e.trial_id,
                    trialRunId=r["trial_run_id"],
                ).to_json()
                for e in self.experiments
                if e.trial_id in ids
                for n, r in enumerate(e.reports)
                if r["group"] == group
            ]
            return 200, Lines([{"result": b.v1GetMetricsResponse.from_json({"metrics": reports}).to_json()}])
        return None

    def _experiment(self, e: ExperimentRecord) -> bindings.v1Experiment:
        return bindings.v1Experiment(
            archived=False,
            config=e.config,
            id=e.id,
            jobId=f"job-{e.id}",
            labels=list(e.config.get("labels") or []),
            name=str(e.config.get("name", f"experiment {e.id}")),
            numTrials=1,
            originalConfig=json.dumps(e.config),
            projectId=1,
            projectOwnerId=1,
            searcherType=str((e.config.get("searcher") or {}).get("name", "single")),
            startTime="2026-11-23T00:00:00Z",
            state=bindings.experimentv1State[e.state],
            username="determined",
        )

    def _trial(self, e: ExperimentRecord) -> bindings.trialv1Trial:

        return bindings.trialv1Trial(
            experimentId=e.id,
            hparams=experiment.local_hparams(e.config),
            id=e.trial_id,
            restarts=0,
            startTime="2026-11-23T00:00:00Z",
            state=bindings.trialv1State[e.trial_state],
            totalBatchesProcessed=max([r["steps_completed"] for r in e.reports] or [0]),
        )

    def add_experiment(
        self,
        conf: dict[str, Any],
        reports: list[dict[str, Any]],
        state: str = "COMPLETED",
        trial_state: str = "COMPLETED",
    ) -> ExperimentRecord:
        """Register an experiment of one trial whose reports another (emulated) run recorded."""
        record = ExperimentRecord(len(self.experiments) + 1, conf, state, trial_state, list(reports))
        self.experiments.append(record)
        return record

    # ---- what a test asks of the master --------------------------------------------------

    def preempt(self) -> None:
        with self.cond:
            for alloc in self.allocations.values():
                alloc.preempt = True
            self.cond.notify_all()

    def stop_by_searcher(self) -> None:
        self.trial_state = bindings.trialv1State.STOPPING_COMPLETED

    def validations(self) -> list[dict[str, Any]]:
        return [r for r in self.metrics if r["group"] == "validation"]
