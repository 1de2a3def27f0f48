"""`shoal embed` of an image model end to end: a folder of images on the moto S3 server, a worker killed.

Among the images are a truncated JPEG and a decompression bomb: both are reported by name and the job finishes;
every other image is in the output exactly once, its vector the reference library's; a worker SIGKILLed mid-job
loses no image; and a rerun over an output missing some parts (a run cut short) redoes only those.
"""

from __future__ import annotations

import io
import json
import subprocess

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from tests.support.cli import embed_args, run_shoal
from tests.support.files import write_profile
from tests.support.image_models import CLIP_DIM, decompression_bomb, draw_images, encoded, truncated
from tests.support.paths import SHOAL
from tests.support.processes import started
from tests.support.s3 import s3_options
from tests.support.worker_loss import kill_busy_worker

pytestmark = pytest.mark.integration

GOOD = 40  # images besides the two bad ones
BUCKET = "shoal-images"


def reference_vectors(folder, images: list[bytes]) -> np.ndarray:
    import torch
    from PIL import Image
    from transformers import AutoModel, AutoProcessor

    model = AutoModel.from_pretrained(folder).eval()
    processor = AutoProcessor.from_pretrained(folder)
    with torch.inference_mode():
        pixels = processor(images=[Image.open(io.BytesIO(d)) for d in images], return_tensors="pt")
        vectors = model.get_image_features(**pixels).pooler_output
    return torch.nn.functional.normalize(vectors, dim=-1).numpy()


def test_a_folder_of_images_on_s3_with_bad_ones_and_a_killed_worker(clip_folder, s3_server, tmp_path) -> None:
    import s3fs
    from distributed import Client

    from shoal.configs import load_profile
    from shoal.pipeline.cluster import start_local_cluster

    options = s3_options(s3_server)
    fs = s3fs.S3FileSystem(**options)
    fs.mkdir(BUCKET)
    pictures = draw_images(GOOD, seed=7, size=(64, 48))
    good = {
        f"{['cats', 'dogs', 'birds'][i % 3]}/{i:03d}.{'png' if i % 4 == 0 else 'jpg'}": p
        for i, p in enumerate(pictures)
    }
    files = {rel: encoded(p, "PNG" if rel.endswith("png") else "JPEG") for rel, p in good.items()}
    files["dogs/broken.jpg"] = truncated(files["dogs/001.jpg"])
    files["birds/deep/bomb.png"] = decompression_bomb()
    fs.pipe({f"{BUCKET}/images/{rel}": data for rel, data in files.items()})
    fs.pipe_file(f"{BUCKET}/images/readme.txt", b"not an image, not listed")

    catalog = tmp_path / "catalog.yaml"  # kind, dim, window and normalisation read from the folder
    catalog.write_text(yaml.safe_dump({"models": {"clip": {"source": str(clip_folder), "image_batch": {"cpu": 4}}}}))
    profile = load_profile(str(write_profile(tmp_path, name="images", rows_per_item=4, lease_seconds=30)))
    output = f"s3://{BUCKET}/vectors"
    with start_local_cluster(profile) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        plugin = cluster.scheduler.extensions["shoal-pull-queue"]
        args = embed_args(
            f"s3://{BUCKET}/images",
            output,
            catalog,
            "--storage-options",
            json.dumps(options),
            scheduler=cluster.scheduler_address,
            profile=profile.path,
            model="clip",
        )
        with started([SHOAL, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as job:
            kill_busy_worker(cluster, job)
            _, stderr = job.communicate(timeout=300)
        assert plugin.state.counts["lost"] >= 1

        assert job.returncode == 1, stderr  # rows were rejected; every other one was written
        manifest = json.loads(fs.cat_file(f"{BUCKET}/vectors/_manifest.json"))
        assert manifest["complete"] and manifest["rows"] == len(files)
        assert manifest["rejected_rows"] == 2
        bomb, broken = manifest["rejected"]
        assert bomb.startswith(f"s3://{BUCKET}/images/birds/deep/bomb.png: 10000x10000 = 100,000,000 pixels")
        assert broken.startswith(f"s3://{BUCKET}/images/dogs/broken.jpg: JPEG 64x48 cannot be decoded")
        assert f"rejected row: s3://{BUCKET}/images/dogs/broken.jpg" in stderr

        table = pq.read_table(f"{BUCKET}/vectors", filesystem=fs)
        ids = table.column("id").to_pylist()
        assert sorted(ids) == sorted(files)  # every image exactly once, the bad ones with a null vector
        vectors = dict(zip(ids, table.column("embedding").to_pylist()))
        assert vectors["dogs/broken.jpg"] is None and vectors["birds/deep/bomb.png"] is None
        names = sorted(good)
        expected = reference_vectors(clip_folder, [files[rel] for rel in names])
        got = np.array([vectors[rel] for rel in names], dtype=np.float32)
        assert got.shape == (GOOD, CLIP_DIM)
        assert ((got * expected).sum(1)).min() >= 0.9999  # both normalised

        # A run cut short: some parts missing. The same command redoes those, and only those.
        parts = sorted(p for p in fs.ls(f"{BUCKET}/vectors") if "/part-" in p)
        fs.rm(parts[:3])
        again = run_shoal(*args)
        assert again.returncode in (0, 1), again.stderr
        items = len(manifest["parts"])
        assert f"resume: {items - 3} of {items} parts already done, 3 run" in again.stderr
        rerun = pq.read_table(f"{BUCKET}/vectors", filesystem=fs)
        assert sorted(rerun.column("id").to_pylist()) == sorted(files)


def test_reindex_of_a_growing_folder_redoes_only_the_changed_items(clip_folder, cluster, tmp_path) -> None:
    from tests.support.cli import invoke_shoal, reindex_job

    _, client = cluster
    folder = tmp_path / "images"
    folder.mkdir()
    pictures = draw_images(41, seed=13, size=(40, 32))
    for i, picture in enumerate(pictures[:40]):
        (folder / f"{i:03d}.jpg").write_bytes(encoded(picture))
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"models": {"clip": {"source": str(clip_folder)}}}))
    profile = write_profile(tmp_path, name="reindex-images", rows_per_item=4)
    job = reindex_job(folder, tmp_path / "out", catalog, client.scheduler.address, model="clip", profile=str(profile))
    path = tmp_path / "images.yaml"
    path.write_text(yaml.safe_dump(job))

    first = invoke_shoal("reindex", str(path))
    assert first.returncode == 0, first.stderr
    version = (tmp_path / "out" / "_CURRENT").read_text().strip()
    manifest = json.loads((tmp_path / "out" / version / "_manifest.json").read_text())
    items = manifest["work"]["items"]
    assert manifest["rows"] == 40 and items >= 5  # groups of about 4 images

    (folder / "017.jpg").write_bytes(encoded(pictures[40]))  # changed
    (folder / "031.jpg").unlink()  # removed
    (folder / "040.jpg").write_bytes(encoded(pictures[17]))  # added
    second = invoke_shoal("reindex", str(path))
    assert second.returncode == 0, second.stderr
    manifest = json.loads((tmp_path / "out" / version / "_manifest.json").read_text())
    assert manifest["rows"] == 40
    assert 1 <= manifest["work"]["run"] <= 4 and manifest["work"]["reused"] >= manifest["work"]["items"] - 4
    table = pq.read_table(tmp_path / "out" / version).sort_by("id")
    ids = table.column("id").to_pylist()
    assert ids == sorted({f"{i:03d}.jpg" for i in range(41)} - {"031.jpg"})
    vectors = dict(zip(ids, table.column("embedding").to_pylist()))
    expected = reference_vectors(clip_folder, [encoded(pictures[40]), encoded(pictures[17])])
    np.testing.assert_allclose(np.array([vectors["017.jpg"], vectors["040.jpg"]]), expected, atol=1e-5)
