"""Runner: build a probe job, run it in an isolated worker process, keep the history file."""
