"""Persistence of allocations and events (SQLAlchemy; an SQLite file by default)."""

from .db import Store
from .elastic import ElasticRange
from .job_pools import JobPools
from .jobs import TrainJob
from .models import Allocation, Event
from .moves import Move  # registers its table before Store creates them
from .parked import Parked  # registers its table before Store creates them
from .sweeps import SweepRun
from .usage_tables import BudgetGrant, UsageHour  # usage accounting and budgets

__all__ = ["Allocation", "BudgetGrant", "ElasticRange", "Event", "JobPools", "Move", "Parked", "Store", "SweepRun",
           "TrainJob", "UsageHour"]
