"""Shared state of a running app and the `Annotated` dependencies routers use to reach it."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated, TypeVar

from fastapi import Depends, Header, HTTPException, Request

from service.admission import Admission
from service.db import Database
from service.generation import ModelHost
from service.jobs import JobRunner
from service.registry import load_trained_drafters
from service.settings import Settings

T = TypeVar("T")


@dataclass
class Services:
    """Everything the lifespan builds once: settings, store, the loaded models, the job runner."""

    settings: Settings
    db: Database
    host: ModelHost
    jobs: JobRunner
    train_methods: tuple[str, ...]  # recipes the injected train_fn implements
    executor: ThreadPoolExecutor  # DB work and health checks run here, off the event loop
    decode_pool: ThreadPoolExecutor  # admitted generations, one thread each (settings.generation_queue)
    admission: Admission  # how many generations are admitted; the next one past the limit gets 429

    async def in_thread(self, fn: Callable[..., T], *args) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def in_decode_pool(self, fn: Callable[..., T], *args) -> T:
        """Run model work (a generation, a prompt's checks) on the generation pool, never on the threads
        that serve reads and health."""
        return await asyncio.get_running_loop().run_in_executor(self.decode_pool, fn, *args)

    async def find_method(self, name: str) -> None:
        """Make sure a method this replica has not loaded gets loaded if a training job (here or on
        another replica sharing the store and SD2_HOME) registered it; unknown names stay unknown."""
        if name not in self.host.engine.methods():
            await self.in_thread(load_trained_drafters, self.db, self.host, self.settings.drafters_dir, name)

    async def query(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """`fn(session, *args, **kwargs)` in one read session, in a worker thread (service.queries)."""

        def read() -> T:
            with self.db.read() as session:
                return fn(session, *args, **kwargs)

        return await self.in_thread(read)


def get_services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]


def require_api_key(
    services: ServicesDep,
    x_api_key: Annotated[str | None, Header(description="required when the server sets SD2_API_KEY")] = None,
) -> None:
    """Mutating endpoints (train, cancel, delete) need the key when one is configured."""
    expected = services.settings.api_key
    if expected is None:
        return
    if x_api_key is None or not hmac.compare_digest(x_api_key.encode(), expected.encode()):
        raise HTTPException(
            status_code=401,
            detail=[{"loc": ["header", "X-API-Key"], "msg": "missing or wrong API key", "type": "auth"}],
        )


ApiKeyDep = Depends(require_api_key)
