"""Persistence of allocations and events (SQLAlchemy; an SQLite file by default)."""

from .db import Store
from .jobs import TrainJob
from .models import Allocation, Event

__all__ = ["Allocation", "Event", "Store", "TrainJob"]
