#!/bin/sh
# `make image`: builds Shoal's CPU image, localhost/shoal:VERSION, with podman from nothing but Debian and PyPI.
#   1. A Debian bookworm base (python3, ca-certificates) made by mmdebstrap, imported once as
#      localhost/shoal-base:bookworm and reused by later builds (`podman rmi` it to make it anew).
#   2. `podman build --target cpu` on that base (a build argument: --from would replace only the first FROM of
#      this multi-stage Containerfile), with pip's configured find-links folder (the local CPU torch wheel on
#      this kind of machine) as the `wheels` build context and this machine's CA bundle as `certs`.
#   3. The image's size, printed.
# In a git checkout it builds the committed HEAD (git archive into out/image/context), not the working tree, so
# the image is exactly the commit its label names; uncommitted changes are not in it.
# podman, mmdebstrap and runc are installed with apt when missing. deploy/containers.conf holds the podman
# settings this kind of VM needs (CONTAINERS_CONF, unless already set).
set -eu
cd "$(dirname "$0")/.."
export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/deploy/containers.conf}"
BASE=localhost/shoal-base:bookworm
CONTEXT=.
COMMIT=unknown
if git rev-parse --verify --quiet HEAD > /dev/null; then
    COMMIT=$(git rev-parse HEAD)
    CONTEXT=out/image/context
    rm -rf "$CONTEXT"
    mkdir -p "$CONTEXT"
    git archive HEAD | tar -x -C "$CONTEXT"
fi
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$CONTEXT/pyproject.toml")
IMAGE=localhost/shoal:$VERSION

if ! command -v podman > /dev/null || ! command -v mmdebstrap > /dev/null || ! command -v runc > /dev/null; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends podman mmdebstrap runc uidmap
fi

if ! podman image exists "$BASE"; then
    mkdir -p out/image
    mmdebstrap --variant=minbase --include=python3,ca-certificates bookworm out/image/base.tar
    podman import out/image/base.tar "$BASE"
    rm out/image/base.tar
fi

set -- --target cpu --network host --build-arg "BASE=$BASE" \
    --build-arg "VERSION=$VERSION" --build-arg "GIT_COMMIT=$COMMIT" -t "$IMAGE" -f "$CONTEXT/Containerfile"
WHEELS=$(python3 -m pip config get global.find-links 2>/dev/null || true)
if [ -n "$WHEELS" ] && [ -d "$WHEELS" ]; then
    set -- "$@" --build-context "wheels=$WHEELS"
fi
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    set -- "$@" --build-context certs=/etc/ssl/certs
fi
podman build "$@" "$CONTEXT"

SIZE=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo "built $IMAGE (commit $COMMIT): $((SIZE / 1000000)) MB"
