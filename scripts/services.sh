#!/usr/bin/env bash
# Start (or reuse) the project's own Mosquitto and PostgreSQL for the tests, on free loopback
# ports, and write their endpoints to .build/services/env; `services.sh stop` stops them.
set -euo pipefail
exec python3 "$(dirname "$0")/services.py" "$@"
