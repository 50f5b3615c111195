"""The service's Prometheus instruments (`GET /metrics`), in a registry of each app's own: tests build many
apps in one process, and two apps never share a count (the default global registry would).

Generation instruments are fed where every generation passes, `service.generation.decode`, through one
`GenerationProbe` per run: the model-lock wait, each Block as the Engine's stream yields it, the outcome.
The speculative counters follow vLLM's spec-decode counters (num_drafts, num_draft_tokens,
num_accepted_tokens, num_accepted_tokens_per_pos) and are derived from the Blocks themselves, with
sd2's own rule of which blocks are judged (`Block.counts_for_tau`: complete speculative blocks), so a
succeeded run adds exactly its `metrics.drafted` / `metrics.accepted` (sd2.metrics, docs/metrics.md).
The steering outcome counter counts the blocks that carry an unsteered counterfactual (runs asked with
`counterfactual: true`) by won / tied / lost, so a succeeded run adds exactly its
`metrics.steering_gain` counts. Names carry the `sd2_` prefix and their unit (`_seconds`, `_total`).
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sd2.trace import Block, BlockKind
from service.admission import Admission

# Seconds. Requests and generations run from milliseconds (a read) to the 60 s time budget and past it.
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # generations per batched forward
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)  # one token's latency
RATE_BUCKETS = (1, 2, 5, 10, 15, 20, 30, 40, 60, 80, 120, 200, 400, 1000)  # one generation's tokens/s


class ServiceMetrics:
    """Every instrument of one app, registered in `registry` (never the process-wide default)."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        per_method, per_request = ("method",), ("method", "route")
        # HTTP (service.http_metrics.HttpMetrics)
        self.http_requests = Counter(
            "sd2_http_requests_total",
            "HTTP requests answered, by method, route template (`unmatched`: no route) and status sent",
            ("method", "route", "status"),
            registry=registry,
        )
        self.http_duration = Histogram(
            "sd2_http_request_duration_seconds",
            "Time from a request's arrival to the end of its response body (a stream's last chunk)",
            per_request,
            buckets=REQUEST_BUCKETS,
            registry=registry,
        )
        # Admission and the model lock
        self.queue_depth = Gauge(
            "sd2_generation_queue_depth",
            "Generations admitted now: decoding, or waiting for the model lock",
            registry=registry,
        )
        self.queue_limit = Gauge(
            "sd2_generation_queue_limit",
            "The most generations admitted at once (SD2_GENERATION_QUEUE); one more gets 429",
            registry=registry,
        )
        self.queue_wait = Histogram(
            "sd2_queue_wait_seconds",
            "Time a generation waited, admitted and checked, before it joined the decode batch",
            buckets=REQUEST_BUCKETS,
            registry=registry,
        )
        self.batch_rows = Histogram(
            "sd2_batch_rows",
            "Generations sharing each batched verifier forward (1: it ran alone; service/scheduler.py)",
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        # Generations, per method
        self.ttft = Histogram(
            "sd2_time_to_first_token_seconds",
            "Time from joining the decode batch to the first emitted token (the prefill's); the wait "
            "before is in sd2_queue_wait_seconds",
            per_method,
            buckets=REQUEST_BUCKETS,
            registry=registry,
        )
        self.inter_token = Histogram(
            "sd2_inter_token_latency_seconds",
            "Per emitted token after the first block: the wall time since the previous block divided by "
            "the tokens this block emitted (one observation per token)",
            per_method,
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self.duration = Histogram(
            "sd2_generation_duration_seconds",
            "Time from joining the decode batch to a generation's end (its result, failure or cancellation)",
            per_method,
            buckets=REQUEST_BUCKETS,
            registry=registry,
        )
        self.tokens_per_second = Histogram(
            "sd2_generation_tokens_per_second",
            "A succeeded generation's emitted tokens over its time in the decode batch (what its client "
            "saw; shared with the generations batched beside it). The aggregate rate is "
            "rate(sd2_emitted_tokens_total)",
            per_method,
            buckets=RATE_BUCKETS,
            registry=registry,
        )
        self.generations = Counter(
            "sd2_generations_total",
            "Generations that ended, by status: succeeded, failed or cancelled (the client left)",
            ("method", "status"),
            registry=registry,
        )
        self.finished = Counter(
            "sd2_generations_finished_total",
            "Succeeded generations by finish reason: stop (a stop token), length (max_new_tokens) or time "
            "(the time budget)",
            ("method", "finish_reason"),
            registry=registry,
        )
        self.emitted_tokens = Counter(
            "sd2_emitted_tokens_total",
            "Tokens emitted, of every block (prefill, verifier steps, speculative blocks; cut ones too)",
            per_method,
            registry=registry,
        )
        # Speculative decoding, per method: judged blocks only (complete speculative blocks)
        self.spec_blocks = Counter(
            "sd2_spec_blocks_total",
            "Judged speculative blocks (complete drafted-and-verified blocks; cut ones are left out)",
            per_method,
            registry=registry,
        )
        self.spec_draft_tokens = Counter(
            "sd2_spec_draft_tokens_total",
            "Draft tokens proposed in judged speculative blocks",
            per_method,
            registry=registry,
        )
        self.spec_accepted_tokens = Counter(
            "sd2_spec_accepted_tokens_total",
            "Draft tokens accepted in judged speculative blocks",
            per_method,
            registry=registry,
        )
        self.spec_accepted_per_position = Counter(
            "sd2_spec_accepted_tokens_per_position_total",
            "Drafts accepted at each draft position (0 = a block's first draft) in judged speculative "
            "blocks; a position's count is at most the one before it, and they sum to the accepted total",
            ("method", "position"),
            registry=registry,
        )

        # Steering against its counterfactual, per method (blocks that carry one)
        self.steering_blocks = Counter(
            "sd2_steering_blocks_total",
            "Blocks with an unsteered counterfactual (requests with counterfactual: true), by outcome: won, "
            "tied or lost (steered against unsteered, by expected accepted drafts)",
            ("method", "outcome"),
            registry=registry,
        )

    def watch(self, admission: Admission) -> None:
        """Read the queue gauges from `admission` at each scrape (nothing to keep in step)."""
        self.queue_depth.set_function(lambda: admission.admitted)
        self.queue_limit.set(admission.limit)

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format (`prometheus_client.CONTENT_TYPE_LATEST`)."""
        return generate_latest(self.registry)

    def generation(self, method: str, queue_wait_s: float) -> GenerationProbe:
        """Start recording a generation of `method` that has just joined the decode batch."""
        self.queue_wait.observe(queue_wait_s)
        return GenerationProbe(self, method)


class GenerationProbe:
    """One generation's instruments, fed from its decode thread: `block` per Block, `finished` at the end.
    Its clock starts when it is built, as the generation joins the decode batch."""

    def __init__(self, metrics: ServiceMetrics, method: str) -> None:
        self._metrics, self._method = metrics, method
        self._started = self._last_token = time.perf_counter()
        self._seen_first_token = False
        self._n_emitted = 0
        self._emitted = metrics.emitted_tokens.labels(method)
        self._ttft, self._inter_token = metrics.ttft.labels(method), metrics.inter_token.labels(method)

    def block(self, block: Block) -> None:
        """Record a Block the moment the stream yields it (before the route's own `on_block`)."""
        now, emitted = time.perf_counter(), len(block.emitted)
        if emitted:
            self._emitted.inc(emitted)
            self._n_emitted += emitted
            if not self._seen_first_token:
                self._ttft.observe(now - self._started)
                self._seen_first_token = True
            else:
                for _ in range(emitted):
                    self._inter_token.observe((now - self._last_token) / emitted)
            self._last_token = now  # a block that emitted nothing leaves its time to the next one's tokens
        if block.kind is BlockKind.SPECULATIVE and block.counts_for_tau:
            self._speculative(block)
        if block.counterfactual is not None:  # every such block, cut ones too, as steering_gain counts
            self._metrics.steering_blocks.labels(self._method, str(block.counterfactual.outcome)).inc()

    def _speculative(self, block: Block) -> None:
        metrics, method = self._metrics, self._method
        metrics.spec_blocks.labels(method).inc()
        metrics.spec_draft_tokens.labels(method).inc(block.k)
        metrics.spec_accepted_tokens.labels(method).inc(block.n_accepted)
        for position in range(block.n_accepted):  # accepted drafts are a prefix of the block's drafts
            metrics.spec_accepted_per_position.labels(method, str(position)).inc()

    def finished(self, status: str, finish_reason: str | None) -> None:
        """The generation ended with `status` (succeeded, failed, cancelled); a result has `finish_reason`."""
        metrics, method = self._metrics, self._method
        seconds = time.perf_counter() - self._started
        metrics.duration.labels(method).observe(seconds)
        if status == "succeeded" and seconds > 0:
            metrics.tokens_per_second.labels(method).observe(self._n_emitted / seconds)
        metrics.generations.labels(method, status).inc()
        if finish_reason is not None:
            metrics.finished.labels(method, finish_reason).inc()
