"""Retake the README screenshots from the real app: the embedded verifier with the shipped drafters,
served by uvicorn on loopback, driven by headless Chromium (Debian's, as in the browser tests).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/readme_screenshots.py [--out assets/screenshots]

Generate: the SD² drafter at k = 4 on a held-out-style chat prompt; Compare: the default columns
(pretrained, distilled, SD²) at T = 0 on the demo prompt. The server keeps its database in a
temporary folder.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import replace
from pathlib import Path

from launcher.serve import build_app
from service.settings import Settings
from service.threaded import loopback_socket, serve_in_thread

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path(os.environ.get("SD2_CHROMIUM", "/usr/bin/chromium"))
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
PROMPT = "Explain in a few sentences why the sky is blue."


def take(base_url: str, out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    shots = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        page = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
        page.set_default_timeout(180_000)
        page.goto(base_url + "/", wait_until="domcontentloaded")
        page.wait_for_selector("#gen-run")
        page.fill("#gen-prompt textarea", PROMPT)
        page.click("#gen-run")
        page.wait_for_selector("#gen-status .sd2-ok")
        page.wait_for_timeout(800)  # let the plots' fade finish
        shots.append(out / "generate.png")
        page.screenshot(path=str(shots[-1]), full_page=True)
        page.get_by_role("tab", name="Compare").click()
        page.click("#cmp-run")
        page.wait_for_selector("#cmp-columns .sd2-col")
        page.wait_for_timeout(800)
        shots.append(out / "compare.png")
        page.screenshot(path=str(shots[-1]), full_page=True)
        browser.close()
    return shots


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--out", type=Path, default=ROOT / "assets" / "screenshots")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sock = loopback_socket()  # bound first: the mounted UI's client must know the port
        db_url = f"sqlite:///{Path(tmp) / 'shots.db'}"
        settings = replace(Settings.from_env(), database_url=db_url, port=sock.getsockname()[1])
        with serve_in_thread(build_app(settings), sock=sock) as url:
            for path in take(url, args.out):
                print(path)


if __name__ == "__main__":
    main()
