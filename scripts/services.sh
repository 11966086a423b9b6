#!/usr/bin/env bash
# Start the local Mosquitto and PostgreSQL the tests talk to, when they are down.
set -euo pipefail

up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if ! up 1883; then
    echo "starting mosquitto on 127.0.0.1:1883"
    mosquitto -d -c /etc/mosquitto/mosquitto.conf
fi
if ! up 5432; then
    echo "starting PostgreSQL on 127.0.0.1:5432"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
fi
for _ in $(seq 1 50); do
    if up 1883 && up 5432; then exit 0; fi
    sleep 0.2
done
echo "mosquitto or PostgreSQL did not come up" >&2
exit 1
