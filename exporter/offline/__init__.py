"""The offline tools: once, acceptance, results, compare, report, plots, loadtest,
simulate-llm, demo. Never imported by the daemon, and never import it."""
