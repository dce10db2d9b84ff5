"""The alert rules shipped for Prometheus (compose/alerts.yml): valid (``promtool check
rules``), each alert's logic right on made-up series (``promtool test rules``), loaded by
the compose Prometheus config, and naming only metrics that exist. That they return series
from the real stack is tests/integration/test_monitoring_e2e.py's."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.support.monitoring import ALERTS, ELSEWHERE, ROOT

COMPOSE = ROOT / "compose"
#: The alerts issue 28 asks for, by what they watch.
REQUIRED = {
    "GatewayHigh5xxRate": "5xx rate",
    "GatewaySlowTimeToFirstToken": "p99 time to first token",
    "TritonDown": "Triton down",
    "RedisDown": "Redis down",
    "BudgetNearlyExhausted": "budget near exhaustion",
    "GatewayShedding": "shedding",
}


def promtool(*args: str | Path) -> str:
    binary = shutil.which("promtool")
    assert binary, "promtool (Debian's prometheus package) is installed by make"
    done = subprocess.run(
        [binary, *map(str, args)], cwd=COMPOSE, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_the_rules_are_valid_and_loaded_by_the_compose_config() -> None:
    assert f"SUCCESS: {len(rules())} rules found" in promtool("check", "rules", ALERTS)
    checked = promtool("check", "config", COMPOSE / "prometheus.yml")
    assert "SUCCESS: 1 rule files found" in checked


def test_every_alert_asked_for_is_shipped_and_its_logic_unit_tested() -> None:
    alerts = {rule["alert"] for rule in rules()}
    assert set(REQUIRED) <= alerts
    tests = yaml.safe_load((COMPOSE / "alerts.test.yml").read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case["exp_alerts"]
    }
    quiet = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if not case["exp_alerts"]
    }
    # Each alert is shown to fire, and not to fire, on series made up for it.
    assert fired == alerts and quiet == alerts
    assert "SUCCESS" in promtool("test", "rules", "alerts.test.yml")


def gateway_metrics() -> set[str]:
    """The names gateway/metrics.py exports (histograms with their series' suffixes)."""
    source = (ROOT / "gateway" / "metrics.py").read_text()
    names = set(re.findall(r'"(gateway_[a-z_]+)"', source))
    suffixes = ("", "_bucket", "_sum", "_count")
    return {name + suffix for name in names for suffix in suffixes}


def test_the_rules_name_only_metrics_the_gateway_exports() -> None:
    named = {m for rule in rules() for m in re.findall(r"\bgateway_[a-z_]+", rule["expr"])}
    assert named - set(ELSEWHERE) <= gateway_metrics(), named - set(ELSEWHERE) - gateway_metrics()
    assert "gateway_redis_up" in named
