"""Observing a running broker: Prometheus metrics, health checks and the live queue view.

``metrics.py`` keeps the counters the handlers bump and builds the metric families at
scrape time; ``views.py`` reads the live state into plain values; ``http.py`` serves
them, with ``web/index.html``, on ``metrics.port`` from the broker's event loop.
"""
