"""Train jobs' logs kept by the hub on Kubernetes, cut at their limit as on one machine.

A pod's log lives only as long as the pod (and the kubelet rotates it at its containerLogMaxSize,
10 MiB by default), so the hub follows each job pod's log stream (`pods/log?follow=true`) into
one file per job under TrainPool.kube_logs_dir. Each run's pod is appended to the same file (a
preempted job's resumed pod goes on where the first stopped, as a resumed run on one machine
does), cut at TrainPool.max_log_mib with one machine's note (runners/wrap.py: `LogCap` writes the
same bytes). The job's page and API read that file, also once its pods are gone.

Bounded: at most `max_streams` pods followed at once, on a connection pool of their own (a follow
holds its connection for the pod's life; on the hub's client they would starve its watches and
writes); a pod waiting for a slot is read from its start once it gets one. A pod gone before
then, or while the hub was down, keeps only what was copied before. Output is written in whole
lines where it can, so the pods of an elastic job do not cut each other's lines.

Across hub restarts: beside each log, `<job>.pods` records how many bytes of each pod's log were
read and which pods are done; a pod followed again skips what was read.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import re
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from gpupool.kube.status import PodView
from gpupool.runners.safe_files import tail_lines

log = logging.getLogger("gpupool.kube")

MIB = 1024 * 1024
READ = 64 * 1024  # bytes read from a stream at once
LINE_MAX = 64 * 1024  # a partial line longer than this is written as it is
RECORD_MAX = 1 << 20  # bytes of a `.pods` record read back (it holds a few entries per pod)
STARTED = ("Running", "Succeeded", "Failed")  # phases whose container has (had) a log
JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")  # a file name, never a path


def cut_note(limit: int) -> bytes:
    """The line a log gets when it reaches its limit: one machine's (runners/wrap.py)."""
    return (
        f"\n--- gpupool: the log reached its limit of {limit // MIB} MiB"
        " (c.TrainPool.max_log_mib); the job goes on, its further output is not kept ---\n"
    ).encode()


class LogCap:
    """What of a stream goes to a log that already holds `written` bytes and may hold `limit`
    (0: no limit): everything up to the limit, then the note once, then nothing; as one
    machine's wrapper copies a run's output (a resumed run starts from the log's size)."""

    def __init__(self, written: int, limit: int) -> None:
        self.written, self.limit, self.cut = written, limit, False

    def feed(self, chunk: bytes) -> bytes:
        if self.cut:
            return b""
        if self.limit and self.written + len(chunk) > self.limit:
            chunk = chunk[: max(0, self.limit - self.written)]
            self.cut = True
        self.written += len(chunk)
        return chunk + cut_note(self.limit) if self.cut else chunk


class KeptLogs:
    """The kept logs of one hub's train jobs: `follow` them from the pods, `read` them back."""

    def __init__(
        self,
        root: str | Path,
        limit: int,
        api_client: client.ApiClient,
        namespace: str,
        max_streams: int = 100,
        retry_s: float = 1.0,
    ) -> None:
        self.root, self.limit, self.namespace = Path(root), limit, namespace
        self.max_streams, self.retry_s = max_streams, retry_s
        self.gone_grace_s = 10.0  # a stream still open this long after its pod went is dropped
        self.hub_client = api_client
        self.api_client: client.ApiClient | None = None  # made at the first follow (_core)
        self.slots = asyncio.Semaphore(max_streams)
        self.views: dict[str, PodView] = {}  # pod uid -> as the controller last saw it
        self.where: dict[str, str] = {}  # pod uid -> its namespace
        self.tasks: dict[str, asyncio.Task[object]] = {}  # pod uid -> its follower
        self.records: dict[str, dict[str, list[Any]]] = {}  # job id -> pod uid -> [bytes read, done]
        self.pending: dict[str, bytes] = {}  # pod uid -> a partial line not yet written
        self.caps: dict[str, LogCap] = {}  # pod uid -> its cut (one per run, as on one machine)
        self._lock = asyncio.Lock()  # one writer at a time: a job's pods share its file

    def _core(self) -> client.CoreV1Api:
        """A client with a connection pool of its own, as large as the streams it may hold: on the
        hub's, the follows would take the connections its watches and writes need."""
        if self.api_client is None:
            config = copy.deepcopy(self.hub_client.configuration)
            config.connection_pool_maxsize = self.max_streams
            self.api_client = client.ApiClient(configuration=config)
        return client.CoreV1Api(self.api_client)

    def path(self, job_id: str) -> Path:
        if not JOB_ID.match(job_id):
            raise ValueError(f"not a job id: {job_id!r}")
        return self.root / f"{job_id}.log"

    # --- following -------------------------------------------------------------
    def follow(self, job_id: str, pods: Iterable[PodView], namespace: str = "") -> None:
        """Follow the logs of the job's pods (in `namespace`, default the hub's) that have started
        and are not followed or done yet (never waits: each gets a task). Called with the
        controller's views at each change."""
        if not JOB_ID.match(job_id):
            return
        done = self.records.get(job_id, {})  # not read yet: the follower reads it, off the loop
        for view in pods:
            if view.uid in self.tasks:
                self.views[view.uid] = view  # its follower asks whether the pod still runs
                if view.gone:
                    # a kubelet ends the stream when the container ends, before the pod goes; a
                    # lost node's never does (no read timeout: jobs may print nothing for hours)
                    asyncio.get_running_loop().call_later(self.gone_grace_s, self.tasks[view.uid].cancel)
                continue
            if view.gone or view.phase not in STARTED or done.get(view.uid, [0, False])[1]:
                continue
            self.views[view.uid] = view
            self.where[view.uid] = namespace or self.namespace
            task = asyncio.create_task(self._follow(job_id, view.uid))
            self.tasks[view.uid] = task
            task.add_done_callback(partial(self._ended, view.uid))

    def _ended(self, uid: str, _task: asyncio.Task[object]) -> None:
        self.tasks.pop(uid, None)
        self.views.pop(uid, None)
        self.where.pop(uid, None)

    async def _follow(self, job_id: str, uid: str) -> None:
        if job_id not in self.records:
            loaded = await asyncio.to_thread(self._load, job_id)
            self.records.setdefault(job_id, loaded)
        if self.records[job_id].get(uid, [0, False])[1]:
            return  # copied before a hub restart
        async with self.slots:
            delay = self.retry_s
            while True:
                try:
                    if await self._stream(job_id, uid):
                        return
                except asyncio.CancelledError:
                    raise
                except ApiException as err:
                    if err.status == 404:  # the pod is gone: nothing more will come
                        await self._write(job_id, uid, b"", 0, done=True)
                        return
                    if err.status == 400:  # not started (yet): the next change follows it again
                        return
                    log.warning("following the log of train job %s failed: %s", job_id, err.status)
                except Exception as err:  # noqa: BLE001 - network: try again while the pod runs
                    log.warning("following the log of train job %s failed: %s", job_id, err)
                view = self.views.get(uid)
                if view is None or view.gone or view.phase != "Running":
                    # ended (and not readable now): what was read is kept; say it is done
                    await self._write(job_id, uid, b"", 0, done=True)
                    return
                await asyncio.sleep(delay)
                delay = min(
                    delay * 2, 10
                )  # nothing is lost meanwhile: the next read starts where this one stopped

    async def _stream(self, job_id: str, uid: str) -> bool:
        """Copy the pod's log from where the record says until the stream ends; True when the
        pod is done (its container ended, or its log reached the limit)."""
        view = self.views[uid]
        skip = int(self.records[job_id].get(uid, [0, False])[0])
        # with _preload_content=False the client hands back the response, not the text it types
        resp: aiohttp.ClientResponse = await self._core().read_namespaced_pod_log(  # type: ignore[assignment]
            view.name,
            self.where.get(uid, self.namespace),
            follow=True,
            _preload_content=False,
            # a job may print nothing for hours: no read timeout, only the connection's
            _request_timeout=aiohttp.ClientTimeout(connect=30, sock_connect=30),
        )
        if not 200 <= resp.status < 300:  # unread content comes back as it is, errors included
            resp.release()
            raise ApiException(status=resp.status, reason=resp.reason)
        try:
            seen = 0
            while chunk := await resp.content.read(READ):
                seen += len(chunk)
                if seen <= skip:
                    continue
                chunk = chunk[len(chunk) - (seen - skip) :] if seen - len(chunk) < skip else chunk
                if await self._write(job_id, uid, chunk, seen, done=False):
                    return True  # cut: the rest is not kept, so not read
        finally:
            resp.release()
        # the stream ends when the container does (or the connection did): done unless it runs
        view = self.views.get(uid, view)
        if view.phase == "Running" and not view.gone:
            return False
        await self._write(job_id, uid, b"", seen, done=True)
        return True

    async def _write(self, job_id: str, uid: str, chunk: bytes, read: int, done: bool) -> bool:
        """Append what of `chunk` the log keeps (whole lines while more may come), record how
        far the pod's log was read; True once the log is cut."""
        async with self._lock:
            data = self.pending.pop(uid, b"") + chunk
            if not done and len(data) < LINE_MAX:
                end = data.rfind(b"\n") + 1
                data, self.pending[uid] = data[:end], data[end:]
            record = self.records.setdefault(job_id, {})
            entry = record.setdefault(uid, [0, False])
            if read:
                entry[0] = read - len(self.pending.get(uid, b""))
            cut = False
            if data:  # no file for a pod that printed nothing: the pod's own log is read then
                cap, cut = await asyncio.to_thread(self._append, job_id, data, self.caps.get(uid), record)
                self.caps[uid] = cap
            entry[1] = done or cut
            if entry[1]:
                self.pending.pop(uid, None)
                self.caps.pop(uid, None)
                await asyncio.to_thread(self._save, job_id, record)
            return cut

    def _append(
        self, job_id: str, data: bytes, cap: LogCap | None, record: dict[str, Any]
    ) -> tuple[LogCap, bool]:
        """In a thread: the log's new bytes, then the record of how far each pod was read (a
        hub that dies in between reads those bytes again: a line twice, never a line lost)."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.path(job_id), flags, 0o600)
        try:
            if cap is None:  # the pod's first bytes: its run goes on from the log's size
                cap = LogCap(os.fstat(fd).st_size, self.limit)
            out = cap.feed(data)
            if out:
                os.write(fd, out)
        finally:
            os.close(fd)
        if out:
            self._save(job_id, record)
        return cap, cap.cut

    def _load(self, job_id: str) -> dict[str, list[Any]]:
        try:
            fd = os.open(self.root / f"{job_id}.pods", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return {}
        try:
            loaded = json.loads(os.read(fd, RECORD_MAX))
        except ValueError:
            return {}
        finally:
            os.close(fd)
        if not isinstance(loaded, dict):
            return {}
        return {
            str(k): [int(v[0]), bool(v[1])]
            for k, v in loaded.items()
            if isinstance(v, list) and len(v) == 2 and isinstance(v[0], int)
        }

    def _save(self, job_id: str, record: dict[str, Any]) -> None:
        tmp, final = self.root / f"{job_id}.pods.tmp", self.root / f"{job_id}.pods"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, json.dumps(record).encode())
        finally:
            os.close(fd)
        os.replace(tmp, final)

    # --- reading ---------------------------------------------------------------
    async def read(self, job_id: str, tail: int, before: int | None = None) -> tuple[list[str], int] | None:
        """The last `tail` lines of the kept log before byte offset `before`, and where the first
        starts; None when nothing is kept for the job."""
        return await asyncio.to_thread(self._read, job_id, tail, before)

    def _read(self, job_id: str, tail: int, before: int | None) -> tuple[list[str], int] | None:
        try:
            fd = os.open(self.path(job_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except (OSError, ValueError):
            return None
        try:
            return tail_lines(fd, tail, before)
        finally:
            os.close(fd)

    async def remove(self, job_ids: Iterable[str]) -> list[str]:
        """Remove the kept logs of these jobs (finished long ago; never one still followed)."""
        ids = [
            j
            for j in job_ids
            if JOB_ID.match(j) and not any(u in self.tasks for u in self.records.get(j, {}))
        ]
        for job_id in ids:
            self.records.pop(job_id, None)
        return await asyncio.to_thread(self._remove, ids)

    def _remove(self, job_ids: list[str]) -> list[str]:
        removed = []
        for job_id in job_ids:
            found = False
            for name in (f"{job_id}.log", f"{job_id}.pods"):
                try:
                    os.unlink(self.root / name)
                    found = True
                except FileNotFoundError:
                    pass
            if found:
                removed.append(job_id)
        return removed

    async def stop(self) -> None:
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.api_client is not None:
            await self.api_client.close()
            self.api_client = None
