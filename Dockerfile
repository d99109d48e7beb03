# triogate: the gateway in a container. Two stages: the build stage installs the project into
# a virtual environment (the README's install command, without -e: an image is not a
# checkout); the runtime stage copies only that environment and runs as a non-root user.
#
#   docker build -t triogate .
#   docker run -p 4000:4000 -v triogate-state:/data -e TRIOGATE_MASTER_KEY=sk-... triogate
#   docker run ... -v $PWD/config:/etc/triogate:ro triogate --config /etc/triogate/production.yaml
#
# On its embedded defaults (a private Redis-compatible server and SQLite, both in /data) one
# container is a whole gateway; with TRIOGATE_REDIS_URL and TRIOGATE_DATABASE_URL (or
# config/production.yaml) many containers share one Redis and one PostgreSQL:
# config/docker-compose.yaml runs two of them.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/triogate
ENV PATH=/opt/triogate/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY triogate ./triogate
RUN python -m pip install .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/triogate/bin:$PATH
COPY --from=build /opt/triogate /opt/triogate

# The state folder (embedded server's append-only file, SQLite, journals, spill files).
RUN useradd --create-home --uid 10001 triogate && mkdir /data && chown triogate /data
USER triogate
WORKDIR /data
VOLUME ["/data"]
EXPOSE 4000

# Readiness, not mere liveness: Redis and SQL are pinged. It answers 200 with
# "status": "degraded" while Redis is down (the gateway still serves, failing open), so a
# Redis blip does not mark every container unhealthy at once.
HEALTHCHECK --interval=15s --timeout=3s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:4000/health/readiness', timeout=2).status == 200 else 1)"]

# The example config's master key is for local use: the gateway refuses it on a public
# address, so set TRIOGATE_MASTER_KEY (or pass your own --config) when running this image.
ENTRYPOINT ["python", "-m", "triogate", "serve", "--host", "0.0.0.0", "--port", "4000"]
