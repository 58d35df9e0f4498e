"""Training: the run loop (schedule, validation, run), checkpoints, data parallelism, loggers, plots and
debugging tools, all built on the step core's public calls."""
