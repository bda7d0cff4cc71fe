"""Usage accounting and budgets: every table they add, in one place, so that the whole schema
change becomes one migration (create these tables; no existing table changes).

What is NOT stored here: the GPU-hours allocated. Those come from the event log itself (each
`release` event carries the interval it closes; open allocations are in gpupool_allocations),
so they are right across hub restarts without any state of their own. Stored here is what the
event log cannot hold compactly: GPU utilization samples, rolled up per hour and workload
session, the admins' budget top-ups and exemptions, and the GPU intervals of train pods on
Kubernetes (which hold no hub allocation, so no event records them).
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import BigInteger, Boolean, DateTime, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.store.models import Base, utcnow


class UsageHour(Base):
    """GPU use of one workload session in one hour, summed from the culler's samples.

    A session is one allocation: (kind, owner, name, since), `since` being when it was
    reserved (epoch seconds). Bounded: one row per session and hour, pruned with retention."""

    __tablename__ = "gpupool_usage_hours"

    hour: Mapped[int] = mapped_column(Integer, primary_key=True)  # epoch seconds // 3600
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)  # build | train
    owner: Mapped[str] = mapped_column(String(255), primary_key=True)
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    since: Mapped[int] = mapped_column(Integer, primary_key=True)  # the session's start, epoch s
    milli: Mapped[int] = mapped_column(Integer, default=0)  # its share
    measured_milli_s: Mapped[int] = mapped_column(BigInteger, default=0)  # share x seconds with data
    used_milli_s: Mapped[int] = mapped_column(BigInteger, default=0)  # GPU busy, milli-GPU x seconds
    peak_memory_mib: Mapped[int] = mapped_column(Integer, default=0)
    share_memory_mib: Mapped[int] = mapped_column(Integer, default=0)  # the memory its share gives
    samples: Mapped[int] = mapped_column(Integer, default=0)


class BudgetGrant(Base):
    """An admin's top-up (extra GPU-hours until a time) or exemption of a user or group."""

    __tablename__ = "gpupool_budget_grants"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target: Mapped[str] = mapped_column(String(300), index=True)  # "user:ann" | "group:students"
    kind: Mapped[str] = mapped_column(String(16))  # topup | exempt
    milli_s: Mapped[int] = mapped_column(BigInteger, default=0)  # a top-up's milli-GPU x seconds
    until: Mapped[int] = mapped_column(Integer)  # epoch seconds: it ends then
    by: Mapped[str] = mapped_column(String(255), default="")
    note: Mapped[str] = mapped_column(Text, default="")
    created: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class PodSpanRow(Base):
    """One train pod's GPU interval on Kubernetes (gpupool.kube.pod_usage.PodSpan), keyed by the
    pod's UID: written by the hub's relist of train pods, read by the usage ledger as a train
    job's GPU-hours. Bounded: one row per pod, pruned with retention once ended."""

    __tablename__ = "gpupool_pod_spans"

    uid: Mapped[str] = mapped_column(String(64), primary_key=True)
    job: Mapped[str] = mapped_column(String(64), index=True)  # the gpupool job id
    owner: Mapped[str] = mapped_column(String(255), index=True)
    milli: Mapped[int] = mapped_column(Integer)  # GPU milli the pod held
    start: Mapped[int] = mapped_column(Integer)  # epoch seconds
    end: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)  # None: running
    node: Mapped[str] = mapped_column(String(255), default="")
    exact: Mapped[bool] = mapped_column(Boolean, default=True)  # False: closed when last seen alive
    seen: Mapped[int] = mapped_column(Integer, default=0)  # last time the hub saw it alive
