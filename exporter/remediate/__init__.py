"""`fleetcanary remediate`: a small leader-elected controller that turns Alertmanager notifications into node
labels, taints and cordons by policy, with dry-run by default, a circuit breaker per pool, an opt-out label,
a minimum hold and quiet period, ownership recorded on the node, an Event with the evidence on every (would-be)
action, an audit log and metrics (docs/remediation.md).

Modules, each with one job: config (the YAML settings), webhook (Alertmanager's payload, parsed and bounded),
policy (which rule an alert matches), ownership (what the controller set on a node, recorded there, and the
patches that set or undo it), breaker (the circuit breaker), lease (leader election), kubeapi (the API calls),
audit (the append-only log), metrics, controller (the decisions), server (HTTP) and main (the subcommand).
"""
