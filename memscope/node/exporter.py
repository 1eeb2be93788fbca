"""Prometheus metrics of the node's torch processes (``memscope daemon --prometheus``).

prometheus_client is imported here only, and this module only when ``--prometheus`` is given.
Each scrape reads the daemon's latest sample (no /proc read on the scrape's thread): gauges named
``memscope_*``, labelled with ``pid``, ``command`` (secrets taken out, shortened) and ``user``.
The server binds 127.0.0.1 unless an address is given: the labels carry command lines.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

COMMAND_CHARS = 200  # a label this long at most (Prometheus keeps every distinct value as a series)
DEFAULT_HOST = "127.0.0.1"


def parse_address(text: str) -> tuple[str, int]:
    """``PORT``, ``HOST:PORT`` or ``[V6]:PORT`` -> (host, port); ValueError with why."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = DEFAULT_HOST, text
    host = host.strip("[]") or DEFAULT_HOST
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"{text!r}: give PORT or HOST:PORT (e.g. 127.0.0.1:9464)") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"{text!r}: the port must be 0-65535")
    return host, number


class _Collector:
    def __init__(self, latest: Callable[[], Any]) -> None:
        self.latest = latest

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        snap = self.latest()
        labels = ["pid", "command", "user"]
        rss = GaugeMetricFamily("memscope_process_host_rss_bytes", "Resident host memory of a torch process",
                                labels=labels)
        gpu = GaugeMetricFamily("memscope_process_gpu_bytes", "GPU memory NVML charges to a torch process",
                                labels=[*labels, "gpu"])
        growth = GaugeMetricFamily("memscope_process_growth_bytes_per_second",
                                   "Rise of the memory a process never gives back, over the daemon's window",
                                   labels=[*labels, "memory"])
        suspect = GaugeMetricFamily("memscope_process_leak_suspect",
                                    "1 while the memory of the process grows steadily (memscope's growth rule)",
                                    labels=labels)
        recorded = GaugeMetricFamily("memscope_process_recorded", "1 while memscope records the process",
                                     labels=labels)
        steps = GaugeMetricFamily("memscope_process_steps_per_second",
                                  "Training steps a second of a process memscope records", labels=labels)
        count = GaugeMetricFamily("memscope_node_torch_processes", "Torch processes memscope sees on this node")
        unreadable = GaugeMetricFamily("memscope_node_unreadable_processes",
                                       "Python processes of other users whose memory map memscope cannot read")
        rows = snap.processes if snap is not None else []
        for row in rows:
            values = [str(row.pid), row.command[:COMMAND_CHARS], row.user]
            rss.add_metric(values, row.host_rss_bytes)
            for index, used in sorted((row.gpu_by_device or {}).items()):
                gpu.add_metric([*values, str(index)], used)
            growth.add_metric([*values, "host_rss"], row.rss.bytes_per_s)
            if row.gpu is not None:
                growth.add_metric([*values, "gpu"], row.gpu.bytes_per_s)
            suspect.add_metric(values, 1 if row.growing else 0)
            recorded.add_metric(values, 1 if row.run_file else 0)
            if row.recorded is not None and row.recorded.steps_per_s is not None:
                steps.add_metric(values, row.recorded.steps_per_s)
        count.add_metric([], len(rows))
        unreadable.add_metric([], len(snap.unreadable) if snap is not None else 0)
        yield from (rss, gpu, growth, suspect, recorded, steps, count, unreadable)


class Exporter:
    """The HTTP server (a thread of prometheus_client's); ``address`` is what it bound."""

    def __init__(self, host: str, port: int, latest: Callable[[], Any]) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(latest))
        self.server, self.thread = start_http_server(port, addr=host, registry=self.registry)
        bound = self.server.server_address
        self.address = f"{'[' + host + ']' if ':' in host else host}:{bound[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
