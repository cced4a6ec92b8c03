# The tuning service: `tune serve` on port 8000.
#   docker build -t cachetile . && docker run -p 8000:8000 cachetile
# The install step is scripts/install.sh with requirements.lock's pinned versions;
# tests/test_container.py runs the same script in a fresh venv and serves from it.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PATH=/opt/cachetile/bin:$PATH

WORKDIR /src
COPY pyproject.toml README.md requirements.lock ./
COPY scripts/install.sh scripts/
COPY cachetile cachetile/
COPY models models/
COPY optimizer optimizer/
COPY backends backends/
COPY api api/
RUN scripts/install.sh /opt/cachetile \
    && rm -rf /src/build \
    && useradd --create-home --uid 10001 cachetile

USER cachetile
WORKDIR /home/cachetile
# The plan cache lives in the user's home; mount a volume here to keep it across containers.
ENV CACHETILE_CACHE=/home/cachetile/cache/plans.sqlite
EXPOSE 8000
CMD ["tune", "serve", "--host", "0.0.0.0", "--port", "8000"]
