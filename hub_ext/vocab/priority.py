"""A train job's priority within its project: one range for the API, `%%train --priority`, the
PromoteToTraining slider and the docs (higher goes first; an equal or higher one is never
preempted by a lower one of the same project)."""

PRIORITY_MIN, PRIORITY_MAX = -100, 100
