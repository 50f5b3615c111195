"""Look and feel: theme, CSS and the large-font (projector) switch. Gradio 6 takes these at
`launch()` / `gr.mount_gradio_app(...)`, not in `gr.Blocks(...)`, hence `launch_kwargs()`."""

from __future__ import annotations

from typing import Any

import gradio as gr

CSS = """
.sd2-header h1 { margin: 0; font-size: 1.6em; }
.sd2-header p { margin: 2px 0 0; color: var(--body-text-color-subdued); }
.sd2-cards { display: grid; grid-template-columns: repeat(5, minmax(0, 1fr)); gap: 10px; }
.sd2-card { border: 1px solid var(--border-color-primary); border-radius: 10px; padding: 10px 12px;
            background: var(--block-background-fill); }
.sd2-card-name { font-size: .9em; color: var(--body-text-color-subdued); font-weight: 600; }
.sd2-card-value { font-size: 1.9em; font-weight: 700; line-height: 1.2; font-variant-numeric: tabular-nums; }
.sd2-card-caption { font-size: .75em; color: var(--body-text-color-subdued); }
.sd2-live .sd2-card-value { color: #2563eb; }
.sd2-trace-box { border: 1px solid var(--border-color-primary); border-radius: 10px; padding: 10px 12px;
                 max-height: 460px; overflow-y: auto; background: var(--block-background-fill); }
.sd2-trace { font-size: 1.02em; }
.sd2-tok { border-radius: 3px; padding: 0 1px; }
.sd2-col { border: 1px solid var(--border-color-primary); border-radius: 10px; padding: 8px 10px;
           min-width: 0; background: var(--block-background-fill); }
.sd2-col-head { border-bottom: 1px solid var(--border-color-primary); margin-bottom: 6px;
                padding-bottom: 4px; }
.sd2-col-stats { font-size: .85em; color: var(--body-text-color-subdued); }
.sd2-status { padding: 8px 12px; border-radius: 8px; margin: 4px 0; }
.sd2-error { background: #fef2f2; color: #991b1b; border: 1px solid #fca5a5; }
.sd2-ok { background: #f0fdf4; color: #166534; border: 1px solid #86efac; }
.sd2-info { background: #eff6ff; color: #1e3a8a; border: 1px solid #bfdbfe; }
.sd2-note { padding: 10px 14px; border-radius: 8px; background: #eff6ff; border: 1px solid #bfdbfe;
            color: #1e3a8a; }
.sd2-progress-track { height: 14px; background: var(--border-color-primary); border-radius: 7px;
                      overflow: hidden; margin-top: 4px; }
.sd2-progress-bar { height: 100%; background: #2563eb; transition: width .3s; }
.sd2-progress-bar.sd2-succeeded { background: #15803d; }
.sd2-progress-bar.sd2-failed, .sd2-progress-bar.sd2-cancelled { background: #dc2626; }
@media (max-width: 900px) { .sd2-cards { grid-template-columns: repeat(2, minmax(0, 1fr)); } }
/* Projector mode: everything one step larger. */
body.sd2-large { --text-xxs: 12px; --text-xs: 14px; --text-sm: 16px; --text-md: 19px; --text-lg: 22px;
                 --text-xl: 26px; --text-xxl: 30px; --block-label-text-size: 16px;
                 --block-title-text-size: 18px; --input-text-size: 19px; --body-text-size: 19px;
                 --button-large-text-size: 20px; --button-small-text-size: 17px;
                 --section-header-text-size: 19px;
                 --checkbox-label-text-size: 18px; }
body.sd2-large .sd2-trace { font-size: 1.35em; }
body.sd2-large .sd2-card-value { font-size: 2.4em; }
"""

LARGE_FONT_JS = "(on) => { document.body.classList.toggle('sd2-large', on); return on; }"


def theme() -> gr.themes.Base:
    """The default theme with local fonts only (nothing fetched from a font CDN)."""
    return gr.themes.Default(primary_hue="blue", neutral_hue="slate")


def launch_kwargs() -> dict[str, Any]:
    """What `launch()` and `gr.mount_gradio_app()` both need besides the Blocks."""
    return {"theme": theme(), "css": CSS, "ssr_mode": False, "footer_links": ["settings"]}
