#!/usr/bin/env bash
# Set up shoal in ./.venv (first run only: shoal, its command-line tools, and the clients the
# README's tour uses) and start the broker in the foreground on 127.0.0.1:9092 with its data
# in ./shoal-data. Extra arguments go to `shoal serve`,
# e.g. `bash scripts/serve.sh --port 0 -o log.segment.bytes=1048576`.
# What it does goes to stderr, one line per step, so that a first run of about a minute
# does not look like a hang.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
say() { printf 'serve.sh: %s\n' "$*" >&2; }

if [ ! -x .venv/bin/python ]; then
    if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        say "shoal needs Python 3.11 or later; $PYTHON is $("$PYTHON" --version 2>&1 || echo missing)." \
            "Set PYTHON=/path/to/python3.11 and run this again."
        exit 1
    fi
    say "first run: creating .venv with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import shoal, kio, crc32c, confluent_kafka, kafka, zstandard" 2>/dev/null \
        || [ pyproject.toml -nt .venv/.shoal-installed ]; then
    say "installing shoal, its tools and the tour's clients (confluent-kafka, kafka-python, zstandard)" \
        "into .venv: about a minute on a new machine, once"
    started=$SECONDS
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[tour]' &
    pip_pid=$!
    next=15
    while kill -0 "$pip_pid" 2>/dev/null; do
        sleep 1
        if [ $((SECONDS - started)) -ge "$next" ] && kill -0 "$pip_pid" 2>/dev/null; then
            say "still installing ($((SECONDS - started)) s so far)"
            next=$((next + 15))
        fi
    done
    if ! wait "$pip_pid"; then
        say "installing into .venv failed (pip's message is above); fix that and run this again"
        exit 1
    fi
    touch .venv/.shoal-installed
    say "installed in $((SECONDS - started)) s; the next start skips this step and is listening within" \
        "a few seconds"
fi
say "starting: .venv/bin/shoal serve --data-dir ./shoal-data${*:+ $*} (Ctrl-C stops it)"
exec .venv/bin/shoal serve --data-dir ./shoal-data "$@"
