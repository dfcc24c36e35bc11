"""fleetcanary: the daemon and the CLI."""
