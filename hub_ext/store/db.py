"""Engine and session set-up. SQLite gets WAL and a busy timeout so that the culler
service and the hub can read while the hub writes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import create_engine, event, select
from sqlalchemy.orm import Session, sessionmaker

from .models import Allocation, Base, Event, Setting


class Store:
    def __init__(self, url: str = "sqlite:///gpupool.sqlite") -> None:
        self.url = url
        self.engine = create_engine(url, future=True)
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
        Base.metadata.create_all(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: committed on success, rolled back on any error."""
        with self._sessions() as s, s.begin():
            yield s

    def allocations(self, **filters: Any) -> list[Allocation]:
        with self.session() as s:
            return list(s.scalars(select(Allocation).filter_by(**filters).order_by(Allocation.id)))

    def events(self, limit: int = 100, **filters: Any) -> list[Event]:
        with self.session() as s:
            q = select(Event).filter_by(**filters).order_by(Event.id.desc()).limit(limit)
            return list(s.scalars(q))

    def get_setting(self, key: str) -> dict | None:
        with self.session() as s:
            row = s.get(Setting, key)
            return dict(row.value) if row else None

    def put_setting(self, key: str, value: dict) -> None:
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

    def record(self, kind: str, message: str, owner: str = "", name: str = "", **data: Any) -> None:
        with self.session() as s:
            s.add(Event(kind=kind, owner=owner, name=name, message=message, data=data))


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=5000")
    cur.execute("PRAGMA synchronous=FULL")  # an allocation that was acknowledged survives kill -9
    cur.close()
