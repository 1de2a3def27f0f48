"""Hugging Face Hub models: found in the local Hub cache, else downloaded into it at a pinned revision.

A Hub id (``ORG/NAME``, or ``ORG/NAME@REV`` for a branch, tag or commit) resolves to one commit: the
client resolves it (the cache's ``refs/main`` when it holds the model, else the Hub), fingerprints that
snapshot, and pins it in the spec's source (``hf:ORG/NAME@COMMIT``). Every worker then loads exactly
those files from its own cache, fetching that commit there if it lacks it: a cluster's machines share no
disk. Downloads are huggingface_hub's own `snapshot_download` into the Hub cache (``HF_HUB_CACHE``, else
``HF_HOME/hub``, else ``~/.cache/huggingface/hub``), from ``HF_ENDPOINT`` (huggingface_hub's setting), so
an interrupted download is resumed and a snapshot is used only when complete. A commit already in the
cache is served from it without a request.

``HF_HUB_OFFLINE=1`` (or a command's ``--offline``) downloads nothing: an id that is not cached is refused,
naming where it was looked for and how to fetch it. Nothing here imports torch; huggingface_hub is
imported only to download, after the environment it reads at import is settled.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from . import ConfigError

HF_PREFIX = "hf:"
OFFLINE_ENV = "HF_HUB_OFFLINE"
TRUE = {"1", "ON", "YES", "TRUE"}  # how huggingface_hub reads a boolean variable


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, found as huggingface_hub finds it, read at call time."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def offline() -> bool:
    """`HF_HUB_OFFLINE` set true, read at call time: nothing is downloaded."""
    return os.environ.get(OFFLINE_ENV, "").upper() in TRUE


def _repo_folder(repo_id: str) -> Path:
    return hub_cache_dir() / ("models--" + repo_id.replace("/", "--"))


def cached_revision(repo_id: str, revision: str | None = None) -> str | None:
    """The commit the local cache holds for `revision` (a commit, or a ref such as ``main``), or None."""
    repo = _repo_folder(repo_id)
    ref = repo / "refs" / (revision or "main")
    try:
        commit = ref.read_text().strip()
    except OSError:
        commit = revision or ""  # a commit given as is
    return commit if commit and (repo / "snapshots" / commit).is_dir() else None


def hub_snapshot(repo_id: str, revision: str | None = None) -> tuple[Path, str]:
    """(snapshot folder, commit) of a Hub model: the cache's, else downloaded (unless offline)."""
    commit = cached_revision(repo_id, revision)
    if offline():
        if commit is None:
            raise _not_cached(repo_id, revision)
        return _repo_folder(repo_id) / "snapshots" / commit, commit
    folder = Path(download(repo_id, commit or revision or "main").folder)
    return folder, folder.name


@dataclass(frozen=True)
class Pulled:
    """What a download left in the cache: the snapshot folder, and the files it fetched now."""

    repo_id: str
    folder: str
    fetched: int  # files downloaded by this call (0: the cache held every one)
    fetched_bytes: int

    @property
    def commit(self) -> str:
        return Path(self.folder).name


def download(repo_id: str, revision: str = "main", refresh: bool = False) -> Pulled:
    """`snapshot_download` of `revision` into the Hub cache; a ConfigError naming the id and the endpoint on failure.

    What the cache holds completely is returned without a request (huggingface_hub checks a snapshot against
    the tree listing it cached with it; one another tool put there is taken as it is), unless `refresh`
    (`shoal models pull`: a branch such as `main` is asked of the Hub again).
    """
    if offline():
        raise _not_cached(repo_id, revision)
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    if not refresh:
        try:
            folder = snapshot_download(repo_id, revision=revision, cache_dir=hub_cache_dir(), local_files_only=True)
            return Pulled(repo_id, str(folder), 0, 0)
        except LocalEntryNotFoundError:  # not cached, or only in part (an interrupted download): fetched below
            pass
    blobs = _repo_folder(repo_id) / "blobs"
    before = _blob_sizes(blobs)
    try:
        folder = snapshot_download(repo_id, revision=revision, cache_dir=hub_cache_dir())
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"model {repo_id!r} (revision {revision}) could not be downloaded from {constants.ENDPOINT}: {first}; "
            f"check the id, the revision and the network (a gated or private model needs HF_TOKEN), or set "
            f"{OFFLINE_ENV}=1 to use only the local cache ({hub_cache_dir()})"
        ) from None
    after = _blob_sizes(blobs)
    new = {blob: size for blob, size in after.items() if before.get(blob) != size}
    return Pulled(repo_id, str(folder), len(new), sum(new.values()))


def _blob_sizes(blobs: Path) -> dict[str, int]:
    try:
        return {entry.name: entry.stat().st_size for entry in os.scandir(blobs) if entry.is_file()}
    except OSError:
        return {}


def _not_cached(repo_id: str, revision: str | None) -> ConfigError:
    repo = _repo_folder(repo_id)
    looked = repo / "snapshots" / revision if revision else repo / "refs" / "main"
    return ConfigError(
        f"model {repo_id!r} is not in the Hugging Face cache (looked in {looked}); nothing is downloaded at "
        f"run time: fetch it where there is internet with `hf download {repo_id}` and copy the cache "
        f"(HF_HOME or HF_HUB_CACHE), or save it to a folder with `SentenceTransformer({repo_id!r}).save(DIR)` "
        f"and pass --model DIR"
    )


def hub_source_path(source: str) -> str:
    """The local snapshot folder of an ``hf:ORG/NAME@REV`` source on this machine, fetched if it lacks it."""
    repo_id, _, revision = source.removeprefix(HF_PREFIX).partition("@")
    return str(hub_snapshot(repo_id, revision or None)[0])


def cached_models() -> list[str]:
    """Hugging Face ids with a snapshot in the local cache, for `shoal models`."""
    root = hub_cache_dir()
    if not root.is_dir():
        return []
    return sorted(
        entry.name.removeprefix("models--").replace("--", "/")
        for entry in root.iterdir()
        if entry.name.startswith("models--") and (entry / "snapshots").is_dir()
    )
