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
/* Gradio puts elem_classes on the HTML component's block and on its inner `.prose` div: the box is the
   inner one (styled on both, the block clipped nothing and drew a second border). */
.prose.sd2-trace-box { border: 1px solid var(--border-color-primary); border-radius: 10px;
                       padding: 10px 12px; max-height: 560px; overflow-y: auto;
                       background: var(--block-background-fill); }
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
.sd2-card-wide { grid-column: 1 / -1; display: flex; align-items: baseline; gap: 14px; flex-wrap: wrap; }
.sd2-card-wide .sd2-card-value { font-size: 1.6em; }
.sd2-outcomes { font-size: 1.15em; font-weight: 600; font-variant-numeric: tabular-nums; }
.sd2-col-gain { font-size: .85em; }
/* The counterfactual row under a block, and the rejection explainer (app.explainer). */
.sd2-cf-row .sd2-cf { border-radius: 3px; padding: 0 1px; }
.sd2-legend-cf { margin-top: 3px; color: var(--body-text-color-subdued); }
[data-why] { cursor: pointer; }
[data-why]:hover { outline: 1px solid #94a3b8; }
.sd2-picked, [data-why].sd2-picked:hover { outline: 3px solid #f59e0b; outline-offset: 1px; }
.sd2-explain { position: relative; }
/* The panel floats under the clicked token (placed by app.explainer's onclick): nothing moves. */
.sd2-why-panel { position: absolute; left: 0; right: 0; z-index: 5; padding: 8px 12px;
                 border: 1px solid var(--border-color-primary); border-left: 5px solid #f59e0b;
                 border-radius: 8px; background: var(--block-background-fill);
                 box-shadow: 0 8px 24px rgba(15, 23, 42, .22); line-height: 1.35; white-space: normal;
                 font-family: var(--font); scroll-margin: 16px; }
.sd2-why-panel[hidden] { display: none; }
.sd2-why-head { display: flex; align-items: baseline; gap: 8px; }
.sd2-why-token { font-family: var(--font-mono, monospace); font-size: 1.25em; white-space: pre; }
.sd2-why-close { margin-left: auto; border: none; background: none; font-size: 1.4em; cursor: pointer;
                 color: var(--body-text-color-subdued); line-height: 1; }
.sd2-why-verdict { margin: 4px 0; font-weight: 600; }
.sd2-why-facts { display: flex; flex-wrap: wrap; align-items: center; gap: 2px 18px; }
.sd2-why-note { color: var(--body-text-color-subdued); font-size: .9em; }
.sd2-why-lists { display: grid; grid-template-columns: repeat(auto-fit, minmax(210px, 1fr)); gap: 4px 16px;
                 margin-top: 6px; }
/* `body .sd2-explain` outranks the `.prose` table borders and paddings of Gradio's HTML component. */
body .sd2-explain .sd2-why-panel :is(table, tr, td, th) { border: none; background: none; padding: 0;
                                                          margin: 0; text-align: left; font-weight: inherit; }
body .sd2-explain .sd2-why-panel table { border-collapse: collapse; margin: 2px 0; font-size: .92em; }
body .sd2-explain .sd2-why-panel :is(td, th) { padding: 0 8px 0 0; }
body .sd2-explain .sd2-why-panel caption { text-align: left; font-weight: 700; caption-side: top;
                                           padding: 0 0 2px; }
.sd2-why-list td:nth-child(2) { font-family: var(--font-mono, monospace); white-space: pre; }
.sd2-why-list td:nth-child(3), .sd2-why-bars td:nth-child(2) { width: 90px; }
.sd2-why-panel td > i { display: block; height: .75em; min-width: 2px; border-radius: 2px;
                        background: #2563eb; }
.sd2-why-panel [data-who=q] td > i { background: #d97706; }
.sd2-why-panel [data-who=r] td > i { background: #9333ea; }
body .sd2-explain .sd2-why-panel tr.sd2-why-self td { font-weight: 700; background: #fef3c7; }
.sd2-why-panel tr.sd2-why-crossed td:nth-child(2) { text-decoration: line-through; color: #dc2626; }
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
body.sd2-large .sd2-why-panel, body.sd2-large .sd2-col-gain { font-size: 1.15em; }
body.sd2-large .prose.sd2-trace-box { max-height: 640px; }
body.sd2-large .sd2-legend { font-size: 1.05em !important; }
"""

LARGE_FONT_JS = "(on) => { document.body.classList.toggle('sd2-large', on); return on; }"


def theme() -> gr.themes.Base:
    """The default theme with local fonts only (nothing fetched from a font CDN)."""
    return gr.themes.Default(primary_hue="blue", neutral_hue="slate")


def launch_kwargs() -> dict[str, Any]:
    """What `launch()` and `gr.mount_gradio_app()` both need besides the Blocks."""
    return {"theme": theme(), "css": CSS, "ssr_mode": False, "footer_links": ["settings"]}
