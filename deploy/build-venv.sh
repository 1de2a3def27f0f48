#!/bin/sh
# Builds /opt/shoal, the image's one virtual environment, in the Containerfile's build stages: torch first and
# pinned ($TORCH, as the Makefile pins it), so nothing later pulls another build; then Shoal from /src without
# extras; then pip itself goes, since the image never installs anything. Wheels in /wheels come first (a local
# CPU torch wheel); $TORCH_INDEX is an extra index for torch (e.g. https://download.pytorch.org/whl/cpu);
# /certs/ca-certificates.crt, when given, is the CA bundle pip trusts.
set -eu
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
if [ -f /certs/ca-certificates.crt ]; then
    export PIP_CERT=/certs/ca-certificates.crt
fi
apt-get update
apt-get install -y --no-install-recommends python3-venv
python3 -m venv /opt/shoal
/opt/shoal/bin/pip install --find-links /wheels ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} "$TORCH"
/opt/shoal/bin/pip install --find-links /wheels /src
# GLiNER span extractors: gliner declares transformers<5.17 and runs on Shoal's newer one (docs/DEPLOY.md)
/opt/shoal/bin/pip install --find-links /wheels --no-deps gliner==0.2.29
/opt/shoal/bin/pip uninstall -y pip
