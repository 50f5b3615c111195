"""The composition layer on top of the stack: the only package that imports `sd2`, `service` and `app`.

It owns the `sd2` console script (`launcher.cli`): the library's commands from `sd2.cli`, plus `serve`
(the REST service with the browser UI mounted beside it, `launcher.serve`) and `ui` (the UI alone).
See docs/architecture.md for the layers.
"""
