"""Service settings, read once from the environment into a frozen dataclass (converted at the edge)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from sd2.choices import DRAFT_WEIGHTS_ENV, PACKED_WEIGHTS_ENV, env_flag
from sd2.paths import sd2_home

# Names that may become dict keys, DB values and folder names under SD2_HOME/drafters: no slashes,
# no leading dot, so a request can never name a path.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_NAME = re.compile(NAME_PATTERN)


def is_safe_name(name: str) -> bool:
    return bool(_NAME.match(name)) and ".." not in name


def parse_drafters(value: str) -> tuple[tuple[str, str], ...]:
    """`name=path,name=path` → ((name, path), ...); every name must be a safe name."""
    pairs = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, sep, path = item.partition("=")
        if not sep or not is_safe_name(name.strip()) or not path.strip():
            raise ValueError(f"SD2_DRAFTERS entries must look like name=path with a plain name, got {item!r}")
        pairs.append((name.strip(), path.strip()))
    return tuple(pairs)


DEFAULT_MAX_BATCH = 8  # generations decoding together (SD2_MAX_BATCH); measured in docs/scale-out.md


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything the service reads from its environment. Each default says why it is safe."""

    home: Path = field(default_factory=sd2_home)  # DB, checkpoints and the converted embedded model
    database_url: str = ""  # empty → sqlite:///<home>/sd2.db; any SQLAlchemy URL (PostgreSQL) scales out
    verifier: str | None = None  # None → the embedded SmolLM2-135M-Instruct
    drafters: tuple[tuple[str, str], ...] = ()  # (name, folder) pairs loaded at start-up
    device: str | None = None  # None → CUDA when available, else CPU; a requested one must be usable
    dtype: str | None = None  # auto | bf16 | fp32 (sd2.devices); None → auto
    draft_step: str | None = None  # auto | eager | compiled (sd2.draft_step); None → auto: compiled on CUDA
    # Packed copies of the weights for oneDNN's CPU kernels (sd2.invariant): faster on CPUs, ≈ 300 MB more
    # for the embedded verifier in bf16 (600 MB in fp32); off for a tight memory budget.
    packed_weights: bool = True
    # The drafters' products on int8 copies of their weights (sd2.int8_weights): auto | int8 | full;
    # None → auto: int8 on a CPU in bf16 (a cheaper draft step, the output still the verifier's)
    draft_weights: str | None = None
    host: str = "127.0.0.1"  # loopback by default: exposing the lab is an explicit choice
    port: int = 8000
    api_key: str | None = None  # when set, mutating endpoints (train, cancel, delete) require X-API-Key
    max_prompt_chars: int = 32_000  # well past the embedded verifier's 8k-token context
    max_new_tokens: int = 1024  # one request cannot hold the model lock for minutes
    max_body_bytes: int = 1_000_000  # a prompt plus chat history, never a data dump
    max_train_steps: int = 10_000
    max_train_chars: int = 500_000  # inline training text; real corpora come with `sd2 train` (issue 3)
    # Generations admitted at once (decoding or waiting for the one model lock); more get 429 at once
    # rather than an unbounded queue. 16 short runs on the embedded pair clear in a few seconds.
    generation_queue: int = 16
    # Generations decoding together in one batch (service/scheduler.py); 1 decodes them one at a time.
    # Beyond it admitted ones wait for a row. See docs/scale-out.md for how the default was chosen.
    max_batch: int = DEFAULT_MAX_BATCH
    # Host headers served (DNS-rebinding guard, service/hosts.py); empty: loopback names when bound to
    # loopback, any otherwise.
    allowed_hosts: tuple[str, ...] = ()
    # How long after its server died a queued or running training job is marked failed by a live replica
    # (renewed every third of it by the server running it; service/jobs.py).
    job_lease_s: float = 30.0
    # Web origins whose pages may call the server from a browser (service/origins.py); empty: none.
    cors_origins: tuple[str, ...] = ()
    db_busy_timeout_ms: int = 30_000  # SQLite: how long a write waits for the lock before it fails (503)
    # Wall time one generation may hold the model once it has the lock; past it the run ends at the next
    # block with finish_reason "time" (0: no budget). A 1024-token verifier run on the embedded pair
    # takes ≈ 50 s on 2 CPU cores; a minute keeps one request from holding the lab for longer.
    generation_time_budget_s: float = 60.0
    # Before serving, measure k = auto's cost profile for every loaded drafter and run one 4-token
    # generation per method (Engine.warm_up: seconds on a CPU), so the first request is not the slow one.
    warm_up: bool = True

    @property
    def time_budget_s(self) -> float | None:
        """The per-generation budget `Engine.stream` takes (None: unbounded)."""
        return self.generation_time_budget_s if self.generation_time_budget_s > 0 else None

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'sd2.db'}"

    @property
    def drafters_dir(self) -> Path:
        """Where training jobs write their checkpoints, one folder per (validated) drafter name."""
        return self.home / "drafters"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        return cls(
            home=sd2_home(env),
            database_url=env.get("SD2_DATABASE_URL", ""),
            verifier=env.get("SD2_VERIFIER") or None,
            drafters=parse_drafters(env.get("SD2_DRAFTERS", "")),
            device=env.get("SD2_DEVICE") or None,
            dtype=env.get("SD2_DTYPE") or None,
            draft_step=env.get("SD2_DRAFT_STEP") or None,
            packed_weights=env_flag(env, PACKED_WEIGHTS_ENV, cls.packed_weights),
            draft_weights=env.get(DRAFT_WEIGHTS_ENV) or None,
            host=env.get("SD2_HOST", cls.host),
            port=int(env.get("SD2_PORT", cls.port)),
            api_key=env.get("SD2_API_KEY") or None,
            max_prompt_chars=int(env.get("SD2_MAX_PROMPT_CHARS", cls.max_prompt_chars)),
            max_new_tokens=int(env.get("SD2_MAX_NEW_TOKENS", cls.max_new_tokens)),
            max_body_bytes=int(env.get("SD2_MAX_BODY_BYTES", cls.max_body_bytes)),
            generation_queue=int(env.get("SD2_GENERATION_QUEUE", cls.generation_queue)),
            max_batch=int(env.get("SD2_MAX_BATCH", cls.max_batch)),
            db_busy_timeout_ms=int(env.get("SD2_DB_BUSY_TIMEOUT_MS", cls.db_busy_timeout_ms)),
            generation_time_budget_s=float(
                env.get("SD2_GENERATION_TIME_BUDGET_S", cls.generation_time_budget_s)
            ),
            allowed_hosts=_names(env.get("SD2_ALLOWED_HOSTS", "")),
            cors_origins=_names(env.get("SD2_CORS_ORIGINS", "")),
            job_lease_s=float(env.get("SD2_JOB_LEASE_S", cls.job_lease_s)),
            warm_up=env_flag(env, "SD2_WARM_UP", cls.warm_up),
        )


def _names(value: str) -> tuple[str, ...]:
    """A comma-separated list → its non-empty entries, stripped."""
    return tuple(part.strip() for part in value.split(",") if part.strip())


def serve_settings(
    host: str | None,
    port: int | None,
    drafters: Mapping[str, str],
    env: Mapping[str, str] | None = None,
    **models: str | bool | None,
) -> Settings:
    """Environment settings with the command line's host, port, extra drafters and the models'
    `verifier`, `device`, `dtype`, `draft_step`, `packed_weights` and `draft_weights` (each None: keep the
    environment's)
    on top."""
    settings = Settings.from_env(os.environ if env is None else env)
    unknown = set(models) - {"verifier", "device", "dtype", "draft_step", "packed_weights", "draft_weights"}
    if unknown:
        raise TypeError(f"unknown model settings: {sorted(unknown)}")
    settings = replace(settings, **{key: value for key, value in models.items() if value is not None})
    bad = [name for name in drafters if not is_safe_name(name)]
    if bad:
        raise ValueError(f"--drafter names must be plain names (letters, digits, _ . -), got {bad}")
    merged = {**dict(settings.drafters), **drafters}
    return replace(
        settings,
        host=host or settings.host,
        port=settings.port if port is None else port,
        drafters=tuple(merged.items()),
    )
