#!/bin/sh
# Install the service into a fresh virtual environment at $1 with the pinned
# dependencies of requirements.lock: the Dockerfile's install step, and what
# tests/test_container.py runs to check it without a Docker engine.
set -eu
prefix="$1"
cd "$(dirname "$0")/.."
python3 -m venv "$prefix"
"$prefix/bin/pip" install --quiet --disable-pip-version-check --requirement requirements.lock
"$prefix/bin/pip" install --quiet --disable-pip-version-check --no-deps .
