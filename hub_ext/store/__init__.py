"""Persistence of allocations and events (SQLAlchemy; an SQLite file by default)."""

from .db import Store
from .elastic import ElasticRange
from .jobs import TrainJob
from .models import Allocation, Event
from .parked import Parked  # registers its table before Store creates them
from .sweeps import SweepRun

__all__ = ["Allocation", "ElasticRange", "Event", "Parked", "Store", "SweepRun", "TrainJob"]
