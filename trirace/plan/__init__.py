"""Pure planning: schedules, layouts and partitions. No torch.distributed in here."""

from .layout import Layout
from .partition import balance, check_sizes, stage_ranges
from .schedule import KINDS, Action, Op, Schedule, ScheduleError, build_schedule, validate

__all__ = ["KINDS", "Action", "Layout", "Op", "Schedule", "ScheduleError", "balance", "build_schedule",
           "check_sizes", "stage_ranges", "validate"]
