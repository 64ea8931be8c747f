"""The server's Prometheus metrics, in a registry of each app's own (several apps in one
process, as in tests, count separately).

>>> m = Metrics()
>>> m.requests.labels(module="echo", code="200").inc()
>>> 'paddlejax_hub_requests_total{code="200",module="echo"} 1.0' in m.render()[0].decode()
True
"""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Items per run_batch call: powers of two, as the predictor's buckets are
BATCH_BUCKETS = tuple(float(1 << i) for i in range(11))
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    """The counters, gauges and histograms of one app, registered in a registry of its own.

    - ``paddlejax_hub_requests_total{module,code}``: answered prediction requests by HTTP status;
    - ``paddlejax_hub_errors_total{module,reason}``: refused or failed ones by reason
      (``bad_request``, ``not_found``, ``too_large``, ``unsupported_media_type``,
      ``client_timeout``, ``overloaded``, ``timeout``, ``internal``);
    - ``paddlejax_hub_batch_size{module}``: items per ``run_batch`` call (histogram);
    - ``paddlejax_hub_request_latency_seconds{module}``: arrival to answer (histogram);
    - ``paddlejax_hub_in_flight``: prediction requests being handled now;
    - ``paddlejax_hub_queue_items{module}``: items waiting for a batch.

    A request for a module that is not served is counted under ``module="-"``, so clients
    cannot grow the label sets without bound.

    >>> Metrics().render()[1].startswith("text/plain")
    True
    """

    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("paddlejax_hub_requests", "Prediction requests answered, by HTTP status",
                                ["module", "code"], registry=r)
        self.errors = Counter("paddlejax_hub_errors", "Prediction requests refused or failed, by reason",
                              ["module", "reason"], registry=r)
        self.batch_size = Histogram("paddlejax_hub_batch_size", "Items per run_batch call", ["module"],
                                    buckets=BATCH_BUCKETS, registry=r)
        self.latency = Histogram("paddlejax_hub_request_latency_seconds", "Seconds from arrival to answer",
                                 ["module"], buckets=LATENCY_BUCKETS, registry=r)
        self.in_flight = Gauge("paddlejax_hub_in_flight", "Prediction requests being handled", registry=r)
        self.queue_items = Gauge("paddlejax_hub_queue_items", "Items waiting for a batch", ["module"], registry=r)

    def render(self) -> tuple[bytes, str]:
        """The metrics in Prometheus' text format, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
