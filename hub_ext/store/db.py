"""Engine and session set-up. SQLite gets WAL and a busy timeout so that the culler
service and the hub can read while the hub writes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sqlalchemy import create_engine, event, select
from sqlalchemy.orm import Session, sessionmaker

from gpupool.store.migrate import upgrade
from gpupool.store.models import Allocation, Event, Setting

if TYPE_CHECKING:
    from gpupool.vocab.kinds import EventKind
    from gpupool.vocab.states import JobEvent


class Store:
    def __init__(self, url: str = "sqlite:///gpupool.sqlite") -> None:
        self.url = url
        self.engine = create_engine(url, future=True)
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
        event.listen(self.engine, "before_cursor_execute", _no_nul, retval=True)
        upgrade(self.engine)  # alembic: new tables and columns come as revisions (store/migrations)
        _private_file(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: committed on success, rolled back on any error."""
        with self._sessions() as s, s.begin():
            yield s

    def allocations(self, **filters: object) -> list[Allocation]:
        with self.session() as s:
            return list(s.scalars(select(Allocation).filter_by(**filters).order_by(Allocation.id)))

    def events(self, limit: int = 100, **filters: object) -> list[Event]:
        with self.session() as s:
            q = select(Event).filter_by(**filters).order_by(Event.id.desc()).limit(limit)
            return list(s.scalars(q))

    def get_setting(self, key: str) -> dict[str, object] | None:
        with self.session() as s:
            row = s.get(Setting, key)
            return dict(row.value) if row else None

    def settings_under(self, prefix: str) -> dict[str, dict[str, Any]]:
        """Every setting whose key starts with `prefix`, in one read (a class's extensions)."""
        with self.session() as s:
            rows = s.scalars(select(Setting).where(Setting.key.startswith(prefix, autoescape=True)))
            return {row.key: dict(row.value) for row in rows}

    def put_setting(self, key: str, value: dict[str, object]) -> None:
        with self.session() as s:
            row = s.get(Setting, key)
            if row is None:
                s.add(Setting(key=key, value=value))
            else:
                row.value = value

    def delete_setting(self, key: str) -> None:
        with self.session() as s:
            row = s.get(Setting, key)
            if row is not None:
                s.delete(row)

    def record(
        self, kind: EventKind | JobEvent, message: str, owner: str = "", name: str = "", **data: object
    ) -> None:
        with self.session() as s:
            s.add(Event(kind=kind, owner=owner, name=name, message=bounded(message), data=data))


MAX_MESSAGE = 2000


def bounded(text: str, limit: int = MAX_MESSAGE) -> str:
    """A message cut to `limit` characters: a hostile input quoted in an error must not
    grow the database (or a reply) by megabytes."""
    return text if len(text) <= limit else text[: limit - 15] + "... (truncated)"


def _private_file(url: str) -> None:
    """The state database holds every user's jobs and events: readable by the hub only."""
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        import os

        path = url.removeprefix("sqlite:///")
        for p in (path, path + "-wal", path + "-shm"):
            try:
                os.chmod(p, 0o600)
            except FileNotFoundError:
                pass


def _no_nul(
    _conn: object, _cursor: object, statement: str, params: object, _context: object, many: bool
) -> tuple[object, ...]:
    """Every text written without NUL characters, on either database: PostgreSQL cannot store one
    (its text types refuse the whole write) while SQLite can, and a hostile name quoted in an event's
    message must not turn a release or a refusal into an error. Lookups get the same text, so they
    still find what was written. JSON is serialized before this (a NUL there is the escape \\u0000)."""
    if many and isinstance(params, list):
        return statement, [_clean(p) for p in params]
    return statement, _clean(params)


def _clean(params: object) -> object:
    if isinstance(params, dict):
        if any(isinstance(v, str) and "\0" in v for v in params.values()):
            return {k: v.replace("\0", "\ufffd") if isinstance(v, str) else v for k, v in params.items()}
    elif isinstance(params, tuple | list) and any(isinstance(v, str) and "\0" in v for v in params):
        return type(params)(v.replace("\0", "\ufffd") if isinstance(v, str) else v for v in params)
    return params


def _sqlite_pragmas(dbapi_conn: Any, _record: object) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=5000")
    # In WAL mode NORMAL keeps every committed transaction through a crash or kill -9 of the hub
    # (the WAL is written before the commit returns; only its fsync waits for a checkpoint); what it
    # gives up is the last commits on a power loss or kernel crash, which end the machine's
    # workspaces too. FULL fsynced each commit: 1-4 ms on the spawn path, two commits per spawn,
    # one under the manager's lock (benchmarks/kube).
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()
