"""Retake the README screenshots from the real app: the embedded verifier with the shipped drafters,
served by uvicorn on loopback, driven by headless Chromium (Debian's, as in the browser tests).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/readme_screenshots.py [--out assets/screenshots]
        [--only generate compare counterfactual]

Generate: the SD² drafter with the default decode settings on a held-out-style chat prompt, its
counterfactual off (the plain trace); Compare: the default columns (pretrained, distilled, SD²) at T = 0
on the demo prompt; Counterfactual: the SD² drafter at k = 4, T = 0 with its counterfactual on (the
unsteered row under each block, won / tied / lost marks, the steering gain card and chart) and the
rejection explainer of the first rejected draft open, clipped to the trace side of the tab. The server
keeps its database in a temporary folder.
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
SHOTS = ("generate", "compare", "counterfactual")
COUNTERFACTUAL_TOKENS = 40  # a short answer keeps both rows of every block on screen


def _open(page, base_url: str) -> None:
    page.goto(base_url + "/", wait_until="domcontentloaded")
    page.wait_for_selector("#gen-run")
    # page load picks the SD² drafter, whose steering turns the counterfactual on
    page.wait_for_function("document.querySelector('#gen-counterfactual input')?.checked === true")


def _generate(page, path: Path) -> None:
    page.fill("#gen-prompt textarea", PROMPT)
    page.uncheck("#gen-counterfactual input")
    page.click("#gen-run")
    page.wait_for_selector("#gen-status .sd2-ok")
    page.wait_for_timeout(800)  # let the plots' fade finish
    page.screenshot(path=str(path), full_page=True)


def _compare(page, path: Path) -> None:
    page.get_by_role("tab", name="Compare").click()
    page.click("#cmp-run")
    page.wait_for_function(  # every column finished (they stream in one after another)
        "[...document.querySelectorAll('#cmp-columns .sd2-col')].every(c => c.dataset.state === 'done')"
    )
    page.wait_for_timeout(800)
    page.screenshot(path=str(path), full_page=True)


def _counterfactual(page, path: Path) -> None:
    page.fill("#gen-prompt textarea", PROMPT)
    page.click("#gen-k input")
    page.get_by_role("option", name="4", exact=True).click()
    page.locator("#gen-max-new").get_by_role("spinbutton").fill(str(COUNTERFACTUAL_TOKENS))
    page.click("#gen-run")
    page.wait_for_selector("#gen-status .sd2-ok")
    # open the explainer of a rejected draft a few lines down: the rows above it stay in view
    page.evaluate(
        """() => { const trace = document.querySelector('#gen-trace .sd2-trace').getBoundingClientRect();
                   const all = [...document.querySelectorAll('#gen-trace .sd2-tok.sd2-rejected[data-why]')];
                   const low = all.find(t => t.getBoundingClientRect().top - trace.top > 100) || all[0];
                   low.click(); }"""
    )
    page.wait_for_timeout(800)
    page.evaluate("window.scrollTo(0, 0)")
    top = page.locator("#gen-status").bounding_box()
    bottom = page.locator("#gen-gain").bounding_box()
    clip = {
        "x": 0,
        "y": top["y"] - 10,
        "width": 1440,
        "height": bottom["y"] + bottom["height"] - top["y"] + 20,
    }
    page.screenshot(path=str(path), clip=clip, full_page=True)


def take(base_url: str, out: Path, only: tuple[str, ...] = SHOTS) -> list[Path]:
    """Each shot in `only` on a freshly loaded page; returns the PNGs written."""
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    steps = {"generate": _generate, "compare": _compare, "counterfactual": _counterfactual}
    shots = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        page = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
        page.set_default_timeout(180_000)
        for name in only:
            _open(page, base_url)
            shots.append(out / f"{name}.png")
            steps[name](page, shots[-1])
        browser.close()
    return shots


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--out", type=Path, default=ROOT / "assets" / "screenshots")
    parser.add_argument("--only", nargs="+", choices=SHOTS, default=list(SHOTS), help="which shots to retake")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sock = loopback_socket()  # bound first: the mounted UI's client must know the port
        db_url = f"sqlite:///{Path(tmp) / 'shots.db'}"
        settings = replace(Settings.from_env(), database_url=db_url, port=sock.getsockname()[1])
        # the lifespan warms every method up: minutes on a busy small CPU
        with serve_in_thread(build_app(settings), sock=sock, start_timeout=900) as url:
            for path in take(url, args.out, tuple(args.only)):
                print(path)


if __name__ == "__main__":
    main()
