"""Persistence of allocations and events (SQLAlchemy; an SQLite file by default)."""

from .db import Store
from .jobs import TrainJob
from .models import Allocation, Event
from .parked import Parked  # registers its table before Store creates them

__all__ = ["Allocation", "Event", "Parked", "Store", "TrainJob"]
