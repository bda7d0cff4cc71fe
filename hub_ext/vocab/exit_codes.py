"""Exit codes with a meaning for gpupool: shared by the checkpoint helper in the job and the
runners that read how a job ended (importable from a job's process: no dependencies)."""

# EX_TEMPFAIL, "try again later": the job saved a checkpoint after SIGTERM and must be resumed.
# A train Job's podFailurePolicy ignores it (no count toward backoffLimit) and makes a new pod;
# exit 0 would make the Job Complete in the middle of its training.
PREEMPTED = 75
