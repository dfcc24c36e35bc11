"""An exporter stand-in for a whole fleet on 127.0.0.1: a page per node, scraped as a real fleet is (one job, a
target per node, the node label from the target), by Prometheus and by VictoriaMetrics alike.

    exporter = FleetExporter({"node-1": {'fleetcanary_gpu_lost{gpu="0"}': 0, ...}, ...})
    exporter.scrape_configs()                    # Prometheus syntax: the `node` label and each node's path
    judged_pages(members)                        # the judge's statistics of a fleet as those pages

judged_pages() renders the statistics the exporter publishes (fleetcanary_judge_*: exporter/judge/exposition.py)
from alerts/build_tests.py's model of them (Member: each statistic a factor of a healthy figure), so the live
engines are fed what the promtool tests are.
"""
from __future__ import annotations

from http.server import BaseHTTPRequestHandler
from pathlib import Path

from alerts import build_tests

from .servers import ServerThread

ROOT = Path(__file__).resolve().parent.parent.parent
Member = build_tests.Member


class FleetExporter(ServerThread):
    """Serves each node's exposition ({series without the node label: value}) at /nodes/NODE/metrics."""

    def __init__(self, expositions: dict[str, dict[str, float]]) -> None:
        pages = {f"/nodes/{node}/metrics": "".join(f"{s} {v!r}\n" for s, v in series.items()).encode()
                 for node, series in expositions.items()}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                page = pages.get(self.path)
                self.send_response(200 if page is not None else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(page or b"")))
                self.end_headers()
                self.wfile.write(page or b"")

            def log_message(self, *args):
                pass

        super().__init__(Handler)
        self.nodes = list(expositions)

    def scrape_configs(self, interval: str = "1s") -> list[dict]:
        """One job, a target per node: the node label and the path come from the target's labels."""
        return [{"job_name": "fleetcanary", "scrape_interval": interval,
                 "static_configs": [{"targets": [self.address],
                                     "labels": {"node": n, "__metrics_path__": f"/nodes/{n}/metrics"}}
                                    for n in self.nodes]}]


def judged_pages(members: dict[str, list[Member]]) -> dict[str, dict[str, float]]:
    """{figure key: its members} -> {node: {series: value}}: what each node's exporter publishes of its judged
    series (the node label left to the scrape)."""
    figures = {f.key: f for f in build_tests.figures()}
    pages: dict[str, dict[str, float]] = {}
    for key, ms in members.items():
        for m in ms:
            for metric, labels, value in build_tests.published(figures[key], m):
                text = ",".join(f'{k}="{v}"' for k, v in labels.items() if k != "node")
                pages.setdefault(m.node, {})[f"{metric}{{{text}}}"] = value
    return pages
