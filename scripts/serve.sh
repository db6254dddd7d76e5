#!/usr/bin/env bash
# Set up shoal in ./.venv (first run only: shoal, its command-line tools, and the clients the
# README's tour uses) and start the broker in the foreground on 127.0.0.1:9092 with its data
# in ./shoal-data. Extra arguments go to `shoal serve`,
# e.g. `bash scripts/serve.sh --port 0 -o log.segment.bytes=1048576`.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import shoal, kio, crc32c, confluent_kafka, kafka, zstandard" 2>/dev/null \
        || [ pyproject.toml -nt .venv/.shoal-installed ]; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[tour]'
    touch .venv/.shoal-installed
fi
exec .venv/bin/shoal serve --data-dir ./shoal-data "$@"
