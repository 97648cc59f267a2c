#!/usr/bin/env bash
# Start dockerd in the background if it is not answering. Installs from Debian what the sandbox needs
# when absent: docker.io + iptables (docker backend), debootstrap (`ratchet sandbox build`), bubblewrap
# (the local backend's netns isolation). Idempotent: with everything present and a healthy daemon it
# returns at once. `./setup.sh test` (and so CI) calls it.
#
#   scripts/start-dockerd.sh            # log: /var/log/ratchet-dockerd.log
#   DOCKERD_WAIT_S=60 scripts/start-dockerd.sh
set -euo pipefail
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

WAIT_S="${DOCKERD_WAIT_S:-60}"
LOG="${DOCKERD_LOG:-/var/log/ratchet-dockerd.log}"

if [ "$(id -u)" != "0" ]; then
    echo "start-dockerd: must run as root (dockerd needs it); try: sudo $0" >&2
    exit 2
fi

missing=()
for pair in dockerd:docker.io iptables:iptables debootstrap:debootstrap bwrap:bubblewrap; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "start-dockerd: installing ${missing[*]} from Debian (about 1 min)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if docker info >/dev/null 2>&1; then
    echo "start-dockerd: dockerd already running"
    exit 0
fi

# A stale pid file from a killed daemon blocks the start.
if [ -f /var/run/docker.pid ] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
    rm -f /var/run/docker.pid
fi

if ! pgrep -x dockerd >/dev/null 2>&1; then
    echo "start-dockerd: starting dockerd (log: $LOG)"
    mkdir -p "$(dirname "$LOG")"
    # setsid: the daemon outlives this script and the CI step that called it.
    setsid dockerd --host=unix:///var/run/docker.sock >>"$LOG" 2>&1 < /dev/null &
fi

for _ in $(seq 1 "$WAIT_S"); do
    if docker info >/dev/null 2>&1; then
        echo "start-dockerd: dockerd is up ($(docker version --format '{{.Server.Version}}'))"
        exit 0
    fi
    sleep 1
done

echo "start-dockerd: dockerd did not answer within ${WAIT_S}s; last lines of $LOG:" >&2
tail -n 30 "$LOG" >&2 || true
exit 1
