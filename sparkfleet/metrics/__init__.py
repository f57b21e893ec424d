"""Prometheus metrics for the fleet, and the Grafana dashboards that read them.

- `names`: every exported metric (name, type, labels, HELP) in one place.
- `poller`: a background thread that gathers facts from every node each interval (one facts round
  trip per node, plus an optional journal/Engram-manifest command), reads the run records (summarised
  once per file by runner/summaries.py, which watch reads too), and keeps the result as an immutable snapshot.
- `collector`: a prometheus-client Collector over that cached snapshot; a scrape never waits on a node.
- `extras`: the node-side command for earlyoom's journal and the lanes' Engram manifests.
- `dashboards`, `provisioning`: Grafana dashboards as Python data, Grafana provisioning and a Prometheus
  scrape config. `sparkfleet exporter` and `sparkfleet dashboards` are the CLI (docs/metrics.md).
"""
