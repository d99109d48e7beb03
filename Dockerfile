# triogate: the gateway on its embedded defaults (a private Redis-compatible server and
# SQLite, both in /data). Give it TRIOGATE_REDIS_URL and TRIOGATE_DATABASE_URL to share
# one Redis and one PostgreSQL between many containers.
#
#   docker build -t triogate .
#   docker run -p 4000:4000 -e TRIOGATE_MASTER_KEY=sk-... -v $PWD/config.yaml:/config.yaml \
#       triogate --config /config.yaml
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY triogate ./triogate
RUN pip install . && rm -rf /src

# The state folder (embedded server's append-only file, SQLite, journals) is a volume.
RUN useradd --create-home --uid 10001 triogate && mkdir /data && chown triogate /data
USER triogate
WORKDIR /data
VOLUME ["/data"]
EXPOSE 4000

HEALTHCHECK --interval=15s --timeout=3s --start-period=10s \
    CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:4000/health/liveliness', timeout=2).status == 200 else 1)"

# The example config's master key is for local use: the gateway refuses it on a public
# address, so set TRIOGATE_MASTER_KEY (or your own config) when running this image.
ENTRYPOINT ["triogate", "serve", "--host", "0.0.0.0", "--port", "4000"]
