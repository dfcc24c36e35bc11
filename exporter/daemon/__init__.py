"""The daemon (`fleetcanary run`): service wiring, scheduler, state, collector, HTTP, web
config, Kubernetes. Never imported by the offline tools, and never imports them."""
