"""A live sd2 service with the UI mounted at `/`, on loopback, over the tiny pair plus three tiny
drafters (pretrained / distilled / SD² stand-ins), and a headless Chromium driven by Playwright."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = Path(os.environ.get("SD2_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
BLOCK_DELAY_S = 0.04  # paces decoding a little so the browser can watch the plot grow
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def real_runs() -> dict[float, dict]:
    """Two real generations with counterfactuals, by temperature: the embedded verifier with the shipped
    SD² drafter, `sd2 generate --method sd2 --k 4 --counterfactual --max-new-tokens 12 --json` (T = 0:
    "Write a haiku about the sea.", seed 0; T = 1: "What is the capital of France?", seed 1)."""
    return {t: json.loads((DATA / f"counterfactual_t{t:g}.json").read_text()) for t in (0.0, 1.0)}


def _paced(stream, delay_s: float):
    """Engine.stream that sleeps between blocks (the tiny pair decodes faster than a browser repaints)."""

    def paced(request, time_budget_s=None):
        for item in stream(request, time_budget_s):
            yield item
            time.sleep(delay_s)

    return paced


@pytest.fixture(scope="session")
def ui_drafters(tmp_path_factory, tiny_pair_dir) -> dict[str, Path]:
    from tests.app.pairs import save_ui_drafters

    verifier_dir, drafter_dir = tiny_pair_dir
    return save_ui_drafters(tmp_path_factory.mktemp("ui_drafters"), verifier_dir, drafter_dir)


@pytest.fixture(scope="session")
def live_ui(tmp_path_factory, tiny_pair_dir, ui_drafters) -> Iterator[str]:
    """Base URL of `launcher.serve.build_app` (API + UI) served by uvicorn on a free loopback port."""
    import torch

    from launcher.serve import build_app
    from sd2.engine import Engine
    from service.settings import Settings
    from service.threaded import loopback_socket, serve_in_thread

    torch.set_num_threads(1)
    sock = loopback_socket()  # bound first: the mounted UI's client must know the port
    verifier_dir, _ = tiny_pair_dir
    drafters = {name: str(folder) for name, folder in ui_drafters.items()}
    settings = Settings(
        home=tmp_path_factory.mktemp("ui_home"), verifier=str(verifier_dir), drafters=tuple(drafters.items()),
        device="cpu", port=sock.getsockname()[1], max_new_tokens=256, max_train_steps=200,
    )  # fmt: skip
    engine = Engine.load(str(verifier_dir), drafters, device="cpu")
    engine.stream = _paced(engine.stream, BLOCK_DELAY_S)
    with serve_in_thread(build_app(settings, engine=engine), sock=sock) as url:
        yield url


@pytest.fixture(scope="session")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(f"browser tests need Debian's chromium at {CHROMIUM}: apt-get install -y chromium")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="browser tests need `pip install playwright`"
    )
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM),
            args=CHROMIUM_FLAGS,  # Playwright gives it a fresh temporary profile
        )
        yield browser
        browser.close()


class RecordedPage:
    """A page plus every URL it requested (to prove nothing leaves loopback)."""

    def __init__(self, page, base_url: str):
        self.page, self.base_url, self.urls = page, base_url, []
        page.on("request", lambda request: self.urls.append(request.url))

    def open(self) -> None:
        self.page.goto(self.base_url + "/", wait_until="domcontentloaded")
        self.page.wait_for_selector("#gen-run", timeout=30_000)

    def tab(self, name: str) -> None:
        self.page.get_by_role("tab", name=name).click()

    def screenshot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
def ui(browser, live_ui) -> Iterator[RecordedPage]:
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(30_000)
    recorded = RecordedPage(page, live_ui)
    try:
        yield recorded
    finally:
        context.close()
