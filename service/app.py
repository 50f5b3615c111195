"""The FastAPI application factory. Nothing happens at import time: `create_app(settings)` builds an
app whose lifespan opens the store, loads the model pair once and starts the training worker."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI

import sd2
from sd2.engine import Engine
from sd2.train.checkpoint import sweep_interrupted_saves
from service import repository
from service.admission import Admission
from service.api_docs import install_api_docs
from service.db import Database
from service.deps import Services
from service.errors import document_common_responses, install_handlers
from service.generation import ModelHost
from service.hosts import HostCheck, allowed_hosts
from service.http_metrics import HttpMetrics
from service.jobs import JobRunner, TrainFn, drafter_info
from service.limits import BodyLimit, MethodCheck
from service.metrics import ServiceMetrics
from service.origins import install_cross_origin_policy
from service.registry import load_trained_drafters
from service.routers import benchmarks, compare, drafters, generate, health, openai_compat, runs, train
from service.routers import metrics as metrics_routes
from service.schemas import ErrorOut
from service.settings import Settings
from service.training import RecipeTrainer

log = logging.getLogger(__name__)
WORKER_THREADS = 32  # DB reads and writes and health checks (generations have their own pool)

DESCRIPTION = """REST API of the sd2 lab: lossless (steered) speculative decoding with a per-token trace.

Every generation is stored as a run with its blocks and token events. Errors are 4xx JSON whose
`detail[].loc` names the offending field; a rejected request writes nothing."""


def create_app(settings: Settings, engine: Engine | None = None, train_fn: TrainFn | None = None) -> FastAPI:
    """Build the app. `engine` and `train_fn` may be injected (tests, embedding); by default the
    lifespan loads the pair named in `settings` and trains with `RecipeTrainer` (sd2.train). The API
    only: the launcher (`launcher.serve.build_app`) mounts the browser UI beside these routes."""

    service_metrics = ServiceMetrics()  # this app's own registry (GET /metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services = _start(settings, engine, train_fn, service_metrics)
        app.state.services = services
        try:
            yield
        finally:
            services.jobs.stop()
            services.host.close()
            services.decode_pool.shutdown(wait=True, cancel_futures=True)
            services.executor.shutdown(wait=True, cancel_futures=True)
            services.db.dispose()

    app = FastAPI(
        title="sd2",
        version=sd2.__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # served from packaged assets below, not a CDN: the docs work offline
        redoc_url=None,
    )
    install_api_docs(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    install_handlers(app)
    modules = (generate, compare, runs, benchmarks, drafters, train, health, metrics_routes, openai_compat)
    for module in modules:
        document_common_responses(module.router, ErrorOut)
        app.include_router(module.router)
    api_routes = [(r.path_regex, frozenset(r.methods)) for m in modules for r in m.router.routes]
    app.add_middleware(MethodCheck, routes=api_routes)
    install_cross_origin_policy(app, settings.cors_origins)  # also keeps a mounted UI's own policy off
    app.add_middleware(HostCheck, allowed=allowed_hosts(settings.host, settings.allowed_hosts))
    templates = [(r.path_regex, r.path) for m in modules for r in m.router.routes]
    app.add_middleware(HttpMetrics, metrics=service_metrics, templates=templates)  # outermost: all count
    return app


def _start(
    settings: Settings, engine: Engine | None, train_fn: TrainFn | None, metrics: ServiceMetrics
) -> Services:
    """Open and migrate the store, load the models, re-register trained drafters, start the job worker."""
    db = Database(settings.db_url, busy_timeout_ms=settings.db_busy_timeout_ms)
    db.migrate()
    if engine is None:
        engine = Engine.load(
            settings.verifier,
            dict(settings.drafters),
            device=settings.device,
            dtype=settings.dtype,
            home=settings.home,
            draft_step=settings.draft_step,
            packed_weights=settings.packed_weights,
            draft_weights=settings.draft_weights,
        )
    if settings.warm_up:
        seconds = engine.warm_up()
        log.info(
            "warmed up in %.1f s (%s)",
            sum(seconds.values()),
            ", ".join(f"{method} {s:.1f} s" for method, s in seconds.items()),
        )
    # what a job's checkpoint save that died mid-way left behind
    for path in sweep_interrupted_saves(settings.drafters_dir):
        log.warning("swept %s, left by a checkpoint save that did not finish", path)
    host = ModelHost(engine, threading.Lock(), settings.time_budget_s, metrics, settings.max_batch)
    for drafter in engine.loaded_drafters():
        repository.upsert_drafter(db, drafter_info(drafter, source="config"))
    load_trained_drafters(db, host, settings.drafters_dir)  # drafters of earlier jobs, after a restart
    fn = train_fn or RecipeTrainer(host)
    jobs = JobRunner(db, host, fn, settings.drafters_dir, lease_s=settings.job_lease_s)
    jobs.start()
    methods = tuple(getattr(fn, "methods", ("pretrain", "distill", "sd2")))
    executor = ThreadPoolExecutor(WORKER_THREADS, thread_name_prefix="sd2-io")
    decode_pool = ThreadPoolExecutor(settings.generation_queue, thread_name_prefix="sd2-decode")
    admission = Admission(settings.generation_queue)
    metrics.watch(admission)  # the queue gauges read it at each scrape
    return Services(
        settings=settings,
        db=db,
        host=host,
        jobs=jobs,
        train_methods=methods,
        executor=executor,
        decode_pool=decode_pool,
        admission=admission,
    )
