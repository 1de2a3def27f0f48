#!/bin/sh
# The runtime stages' system part: python3 when the base lacks it (debian:bookworm-slim, CUDA bases), and the
# non-root user `shoal` (uid and gid 10001) with a writable home, written into /etc/passwd directly because a
# minimal base may have no useradd.
set -eu
if ! command -v python3 > /dev/null; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3
    rm -rf /var/lib/apt/lists/*
fi
echo 'shoal:x:10001:10001:Shoal:/home/shoal:/usr/sbin/nologin' >> /etc/passwd
echo 'shoal:x:10001:' >> /etc/group
mkdir -p /home/shoal
chown 10001:10001 /home/shoal
