# icespool container image.
#   docker build -t icespool .
#   openssl rand -hex 32 > icespool-token && chmod 0644 icespool-token
#   docker run -p 8080:8080 -v icespool-data:/var/lib/icespool \
#     -v "$PWD/icespool-token:/run/secrets/icespool-token:ro" icespool
# The config is /etc/icespool/icespool.toml (ICESPOOL_CONFIG): it listens on every
# interface and so needs the Bearer token file above (it does not start without it).
# Mount your own config over it and pass secrets as ICESPOOL__SECTION__KEY variables.

# ---------------------------------------------------------------- builder: wheel + venv
FROM python:3.11-slim AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements/ requirements/
COPY spool/ spool/
COPY daemon/ daemon/
# Every dependency ships manylinux wheels, so no compiler is needed even here; the venv
# is self-contained and copied whole into the final stage. The dependencies come from the
# lock (exact versions, sha256 hashes; `make lock`), the project itself without resolving
# anything more. image.txt: a Glue catalog (boto3), Azure storage (adlfs) and a Hive
# Metastore (thrift) besides REST, SQL and S3; ICESPOOL_LOCK=run.txt builds without them.
ARG ICESPOOL_LOCK=image.txt
RUN python -m venv /opt/icespool \
    && /opt/icespool/bin/pip install --upgrade pip==25.3 \
    && /opt/icespool/bin/pip install --require-hashes --no-deps -r "requirements/${ICESPOOL_LOCK}" \
    && /opt/icespool/bin/pip install --no-deps --no-build-isolation .

# ---------------------------------------------------------------- final: runtime only
FROM python:3.11-slim

# A fixed uid/gid so volume ownership and Kubernetes runAsUser agree.
RUN groupadd --system --gid 10001 icespool \
    && useradd --system --uid 10001 --gid icespool --home-dir /var/lib/icespool \
       --shell /usr/sbin/nologin icespool \
    && mkdir -p /var/lib/icespool /etc/icespool \
    && chown icespool:icespool /var/lib/icespool

COPY --from=builder /opt/icespool /opt/icespool
COPY --chown=root:icespool deploy/icespool-container.toml /etc/icespool/icespool.toml

ENV PATH=/opt/icespool/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    ICESPOOL_CONFIG=/etc/icespool/icespool.toml

# The spool holds acked, not yet committed records: it must outlive the container.
VOLUME ["/var/lib/icespool"]
WORKDIR /var/lib/icespool
# Numeric, so Kubernetes can verify runAsNonRoot without reading /etc/passwd.
USER 10001:10001
EXPOSE 8080

# slim has no curl: probe with the interpreter the daemon runs on.
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4).status == 200 else 1)"]

# SIGTERM drains (every table commits within 30 s); give `docker stop -t 45` or more.
STOPSIGNAL SIGTERM
ENTRYPOINT ["icespool"]
CMD ["run"]
