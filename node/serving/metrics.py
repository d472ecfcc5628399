"""Prometheus metrics of one node app, in a CollectorRegistry of its own (never the global one).

Counted by the node: requests by route and status, prompt and generated tokens, embedding
inputs and their tokens by L1 outcome, time to first token, request latency, L1 archive hits and misses and lookup latency, Conclaves (by
decision, candidates by outcome). Read at scrape
time from their owners: the engine's queue depth, active sequences and resident prefixes, the archive
client's errors per operation, the prefix KV cache's counters per tier (`CacheStats`), and
the kernel path with the step cost line (`KernelSeries`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class LiveStats(Collector):
    """Series whose values live elsewhere, read when Prometheus scrapes."""

    def __init__(self, engine_stats: Callable[[], Mapping[str, Any]], archive_errors: Callable[[], Mapping[str, int]],
                 archive_state: Callable[[], str]) -> None:
        self.engine_stats = engine_stats
        self.archive_errors = archive_errors
        self.archive_state = archive_state

    def collect(self) -> Iterator[Any]:
        stats = self.engine_stats()
        for name, key, doc in (
            ("reame_queue_depth", "queued", "Requests waiting for an engine slot"),
            ("reame_active_sequences", "active", "Sequences being prefilled or decoded"),
            ("reame_kv_cells_used", "kv_cells_used", "KV cache cells in use"),
            ("reame_engine_threads", "threads", "llama.cpp threads the engine decodes with"),
            ("reame_slot_refill_ratio", "slot_refill",
             "Part of the slots lately freed mid-batch that an arriving request took again at once"),
        ):
            if isinstance(stats.get(key), (int, float)):
                yield GaugeMetricFamily(name, doc, value=stats[key])
        for name, key, doc in (
            ("reame_prefix_resident_hits", "resident_hits", "Prompts continued from a free slot's resident KV"),
            ("reame_prefix_resident_tokens", "resident_tokens", "Prompt tokens a resident slot's KV held already"),
            ("reame_prefix_resident_evicted", "resident_evicted", "Resident slot KV cleared for the cells"),
            ("reame_shared_row_tokens", "shared_rows", "Tokens a sequence drew from an identical sibling's rows"),
            ("reame_prefix_copied_tokens", "prefix_copied_tokens",
             "Prompt tokens a new request took from another active request's KV instead of computing them"),
            ("reame_prefix_waits", "prefix_waits",
             "Prompts that waited for one being prefilled to compute the prefix they share"),
        ):
            if isinstance(stats.get(key), (int, float)):
                yield CounterMetricFamily(name, doc, value=stats[key])
        if isinstance(stats.get("kv_cells_resident"), (int, float)):
            yield GaugeMetricFamily("reame_kv_cells_resident", "KV cells free slots hold for resident prefixes",
                                    value=stats["kv_cells_resident"])
        errors = CounterMetricFamily("reame_archive_errors", "Archive operations that failed (answered as misses)",
                                     labels=["operation"])
        for operation, count in self.archive_errors().items():
            errors.add_metric([operation], count)
        yield errors
        state = GaugeMetricFamily("reame_archive_up", "1 when the archive answers (embedded or remote ARCA)")
        state.add_metric([], 0.0 if self.archive_state() == "degraded" else 1.0)
        yield state


class KernelSeries(Collector):
    """The kernel path (node/engine/kernels.py) as an info series, and the step cost line: the
    speculation controller's calibrated one when there is one, else the kernel probe's."""

    def __init__(self, report: Callable[[], Mapping[str, Any]],
                 line_ms: Callable[[], Mapping[str, float] | None]) -> None:
        self.report = report
        self.line_ms = line_ms

    def collect(self) -> Iterator[Any]:
        report = self.report()
        info = GaugeMetricFamily("reame_kernel_info", "The CPU kernels llama.cpp runs (always 1; the labels say which)",
                                 labels=["machine", "features", "extra_buffers", "buffers", "reason"])
        info.add_metric([str(report.get("machine", "")), " ".join(report.get("features", ())),
                         str(report.get("extra_buffers", "")), " ".join(sorted(report.get("buffers", {}))),
                         str(report.get("reason", ""))], 1.0)
        yield info
        if report.get("huge_pages_mib") is not None:
            yield GaugeMetricFamily("reame_weights_huge_pages_bytes", "The model's weights in huge pages "
                                    "([memory] huge_pages)", value=float(report["huge_pages_mib"]) * 2**20)
        line = self.line_ms()
        if line:
            cost = GaugeMetricFamily("reame_step_cost_seconds", "The step cost line: seconds per step and per token "
                                     "with logits", labels=["part"])
            cost.add_metric(["per_step"], line["per_step"] / 1000)
            cost.add_metric(["per_token"], line["per_token"] / 1000)
            yield cost


# PrefixCache.stats() name -> (series, label values, help). Series sharing a name share a family.
CACHE_COUNTERS: dict[str, tuple[str, dict[str, str], str]] = {
    "lookups": ("reame_prefix_cache_lookups", {}, "Prompts the engine looked up in the prefix cache"),
    "ram_hits": ("reame_prefix_cache_hits", {"tier": "ram"}, "Prefix restores found, by tier"),
    "disk_hits": ("reame_prefix_cache_hits", {"tier": "disk"}, ""),
    "fleet_hits": ("reame_prefix_cache_hits", {"tier": "fleet"}, ""),
    "ram_misses": ("reame_prefix_cache_misses", {"tier": "ram"}, "Lookups a tier could not serve"),
    "disk_misses": ("reame_prefix_cache_misses", {"tier": "disk"}, ""),
    "fleet_misses": ("reame_prefix_cache_misses", {"tier": "fleet"}, ""),
    "exact_hits": ("reame_prefix_cache_exact_hits", {},
                   "Restores to the token: a state at a prompt's exact fork point, or one cut where they part"),
    "exact_stores": ("reame_prefix_cache_exact_stores", {}, "States stored at a prompt's exact fork point (RAM only)"),
    "tokens_restored": ("reame_prefix_cache_tokens_restored", {}, "Prompt tokens restored instead of prefilled"),
    "tokens_prefilled": ("reame_prefix_cache_tokens_prefilled", {}, "Prompt tokens prefilled after the lookup"),
    "restore_seconds": ("reame_prefix_cache_restore_seconds", {}, "Time to find, read and verify restored states"),
    "bytes_stored_ram": ("reame_prefix_cache_stored_bytes", {"tier": "ram"}, "State bytes stored, by tier"),
    "bytes_stored_disk": ("reame_prefix_cache_stored_bytes", {"tier": "disk"}, ""),
    "fleet_bytes_pushed": ("reame_prefix_cache_stored_bytes", {"tier": "fleet"}, ""),
    "ram_evicted_bytes": ("reame_prefix_cache_evicted_bytes", {"tier": "ram"}, "State bytes evicted, by tier"),
    "disk_evicted_bytes": ("reame_prefix_cache_evicted_bytes", {"tier": "disk"}, ""),
    "fleet_bytes_fetched": ("reame_prefix_cache_fetched_bytes", {}, "State bytes fetched from ARCA's L3"),
    "fleet_fetch_seconds": ("reame_prefix_cache_fleet_seconds", {"stage": "fetch"},
                            "Time spent on states fetched from ARCA's L3, by stage"),
    "fleet_verify_seconds": ("reame_prefix_cache_fleet_seconds", {"stage": "verify"}, ""),
    "stores": ("reame_prefix_cache_stores", {}, "States stored"),
    "stores_dropped": ("reame_prefix_cache_stores_dropped", {}, "States kept in RAM only: disk writer busy"),
    "disk_preloads": ("reame_prefix_cache_disk_preloads", {}, "Disk states read ahead of the engine's lookup"),
    "disk_corrupt_deleted": ("reame_prefix_cache_corrupt_deleted", {}, "Files failing verification, deleted"),
    "disk_write_errors": ("reame_prefix_cache_write_errors", {}, "Disk writes that failed"),
    "fleet_pushes": ("reame_prefix_cache_fleet_pushes", {}, "States pushed to ARCA's L3"),
    "fleet_pushes_dropped": ("reame_prefix_cache_fleet_pushes_dropped", {}, "Pushes skipped: too many in flight"),
    "fleet_errors": ("reame_prefix_cache_fleet_errors", {}, "L3 fetches or pushes that failed"),
    "fleet_timeouts": ("reame_prefix_cache_fleet_timeouts", {}, "L3 prefetches given up (prefilled instead)"),
}
CACHE_GAUGES: dict[str, tuple[str, dict[str, str], str]] = {
    "ram_bytes": ("reame_prefix_cache_bytes", {"tier": "ram"}, "Bytes held now, by tier"),
    "disk_bytes": ("reame_prefix_cache_bytes", {"tier": "disk"}, ""),
    "ram_entries": ("reame_prefix_cache_entries", {"tier": "ram"}, "States held now, by tier"),
    "disk_entries": ("reame_prefix_cache_entries", {"tier": "disk"}, ""),
}


class CacheStats(Collector):
    """The prefix KV cache's counters (PrefixCache.stats()), read when Prometheus scrapes."""

    def __init__(self, stats: Callable[[], Mapping[str, float]]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Any]:
        stats = self.stats()
        for table, family_type in ((CACHE_COUNTERS, CounterMetricFamily), (CACHE_GAUGES, GaugeMetricFamily)):
            families: dict[str, Any] = {}
            for key, (name, labels, doc) in table.items():
                if key not in stats:
                    continue
                family = families.get(name)
                if family is None:
                    family = families[name] = family_type(name, doc, labels=list(labels))
                family.add_metric(list(labels.values()), stats[key])
            yield from families.values()


class SpeculationSeries(Collector):
    """Per draft source: tokens drafted and kept, accepted-length histogram, verify and saved seconds."""

    def __init__(self, snapshot: Callable[[], Mapping[str, Mapping[str, Any]]]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        sources = self.snapshot()
        counters = {
            "drafted": CounterMetricFamily("reame_speculation_drafted_tokens", "Draft tokens verified, by source",
                                           labels=["source"]),
            "accepted": CounterMetricFamily("reame_speculation_accepted_tokens", "Draft tokens kept, by source",
                                            labels=["source"]),
            "verify_seconds": CounterMetricFamily("reame_speculation_verify_seconds",
                                                  "Decode time spent on draft tokens, by source", labels=["source"]),
        }
        saved = GaugeMetricFamily("reame_speculation_saved_seconds",
                                  "Estimated decode time saved (plain decoding's time for kept tokens - verify)",
                                  labels=["source"])
        on = GaugeMetricFamily("reame_speculation_source_on", "1 while the controller uses the source",
                               labels=["source"])
        lengths = HistogramMetricFamily("reame_speculation_accepted_length", "Draft tokens kept per verified draft",
                                        labels=["source"])
        for name, stats in sources.items():
            for key, family in counters.items():
                family.add_metric([name], float(stats[key]))
            saved.add_metric([name], float(stats["saved_seconds"]))
            on.add_metric([name], 1.0 if stats["on"] else 0.0)
            histogram, running = [], 0
            for length, count in enumerate(stats["accepted_lengths"]):
                running += count
                histogram.append((str(length), running))
            histogram.append(("+Inf", running))
            lengths.add_metric([name], histogram, sum_value=float(stats["accepted"]))
        yield from counters.values()
        yield saved
        yield on
        yield lengths


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("reame_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=self.registry)
        self.prompt_tokens = Counter("reame_prompt_tokens", "Prompt tokens of answered requests",
                                     registry=self.registry)
        self.generated_tokens = Counter("reame_generated_tokens", "Tokens generated by the model (not cache hits)",
                                        registry=self.registry)
        self.ttft = Histogram("reame_time_to_first_token_seconds", "From request arrival to the first text",
                              ["cache"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.latency = Histogram("reame_request_latency_seconds", "From request arrival to the last byte",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.archive_hits = Counter("reame_archive_hits", "L1 lookups answered from the archive",
                                    registry=self.registry)
        self.archive_misses = Counter("reame_archive_misses", "L1 lookups that found nothing (or failed)",
                                      registry=self.registry)
        self.archive_latency = Histogram("reame_archive_latency_seconds", "Archive round trips by operation",
                                         ["operation"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.conclave_requests = Counter("reame_conclave_requests", "Conclave (best-of-N consensus) requests started",
                                         registry=self.registry)
        self.conclave_decisions = Counter("reame_conclave_decisions", "Conclaves decided, by how the vote went",
                                          ["decision"], registry=self.registry)
        self.conclave_candidates = Counter("reame_conclave_candidates",
                                           "Conclave candidates: finished, stopped mid-generation (cancelled) "
                                           "or never started (skipped)", ["outcome"], registry=self.registry)
        self.conclave_starts = Counter("reame_conclave_starts", "Conclaves by how they started: their first "
                                       "candidates (adaptive), or all at once", ["start"], registry=self.registry)
        self.embedding_inputs = Counter("reame_embedding_inputs", "Inputs embedded, by L1 outcome (hit: computed "
                                        "nothing)", ["cache"], registry=self.registry)
        self.embedding_tokens = Counter("reame_embedding_tokens", "Tokens of embedded inputs, by L1 outcome",
                                        ["cache"], registry=self.registry)
        self.background_dropped = Counter("reame_archive_writes_dropped",
                                          "Archive writes skipped because too many were pending",
                                          registry=self.registry)

    def conclave_outcome(self, outcome: Any) -> None:
        """Count a decided Conclave (node/serving/conclave/runner.py's Outcome)."""
        self.conclave_decisions.labels(outcome.verdict.method).inc()
        self.conclave_candidates.labels("finished").inc(outcome.started - outcome.cancelled)
        self.conclave_candidates.labels("cancelled").inc(outcome.cancelled)
        self.conclave_candidates.labels("skipped").inc(outcome.candidates - outcome.started)
        self.conclave_starts.labels("all_at_once" if outcome.at_once else "first").inc()

    def watch(self, live: Collector) -> None:
        self.registry.register(live)

    def render(self) -> bytes:
        return generate_latest(self.registry)
