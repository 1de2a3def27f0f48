#!/bin/sh
# The image's entry point. `dask scheduler …` and `dask worker …` run with Shoal's preloads added
# (--preload shoal.scheduler_plugins, --preload shoal.workers); anything else (`shoal …`) runs as given.
# A worker given no address first (the Dask operator passes it in DASK_SCHEDULER_ADDRESS) gets that address put
# first, where the `--shoal-…` options need it (docs/DEPLOY.md, "Worker options").
set -eu
if [ "${1:-}" = dask ] && [ "${2:-}" = scheduler ]; then
    shift 2
    exec dask scheduler --preload shoal.scheduler_plugins "$@"
fi
if [ "${1:-}" = dask ] && [ "${2:-}" = worker ]; then
    shift 2
    case "${1:--}" in
        -*) address="${DASK_SCHEDULER_ADDRESS:-}" ;;
        *) address="$1"; shift ;;
    esac
    exec dask worker ${address:+"$address"} --preload shoal.workers "$@"
fi
exec "$@"
