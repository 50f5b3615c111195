"""The sd2 REST service: FastAPI over the `sd2` engine, with a SQLAlchemy trace store
(docs/interfaces.md#rest-api).

Importing this package creates nothing: call `service.app.create_app(settings)`.
"""
