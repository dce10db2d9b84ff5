"""What the monitoring tests share: the Grafana dashboard's queries, the alert rules' files,
and the metrics a one-Triton stack cannot export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "compose" / "grafana" / "dashboards" / "gateway.json"
ALERTS = ROOT / "compose" / "alerts.yml"

#: Metrics the dashboard and the alerts use that a stack with one Triton never exports, and
#: where they are checked instead: the monitoring tests accept "no series" for these only.
ELSEWHERE = {
    "gateway_route_total": "only with several Tritons (tests/integration/test_triton_pool.py)",
}


def dashboard_panels() -> list[tuple[str, list[str]]]:
    """Each panel of the dashboard that queries something: its title and its queries."""
    found: list[tuple[str, list[str]]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            exprs = [t["expr"] for t in panel.get("targets", []) if t.get("expr")]
            if exprs:
                found.append((panel["title"], exprs))
            walk(panel.get("panels", []))

    walk(json.loads(DASHBOARD.read_text())["panels"])
    return found
