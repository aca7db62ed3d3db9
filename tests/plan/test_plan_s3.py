"""`megacpp plan` with an `s3://` data dir, on an S3-compatible server on loopback: what the
bucket holds now comes from its listing (no object read), what the stages write is counted
for the bucket, and only what is built locally (the snapshot, the Megatron export) for the
local disk."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pyarrow.fs as pafs

from megacpp_pipeline import cli
from megacpp_pipeline.plan.sizing import store_usage
from tests.fixtures.pipeline_corpus import write_catalog
from tests.fixtures.s3_server import NEEDS_S3_SERVER, moto_bucket

pytestmark = NEEDS_S3_SERVER
BUCKET = "megacpp-plan"


def test_an_s3_data_dir_is_sized_by_its_listing_and_planned_for_the_bucket(
    tmp_path: Path,
) -> None:
    with moto_bucket(BUCKET) as endpoint:
        fs = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http")
        for i in range(3):  # what an earlier run left there
            with fs.open_output_stream(f"{BUCKET}/data/assets/x/part-{i}.parquet") as f:
                f.write(b"x" * 1000)
        uri = f"s3://{BUCKET}/data?endpoint_override={endpoint}&scheme=http"
        usage = store_usage(uri)
        assert (usage.local, usage.objects, usage.bytes) == (False, 3, 3000)

        catalog, _ = write_catalog(tmp_path)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = cli.main(
                ["plan", "--config", str(catalog), "--data-dir", uri,
                 "--cache-dir", str(tmp_path / "cache"), "--json"]
            )  # fmt: skip
        assert code == 0
        import json

        plan = json.loads(out.getvalue())
        assert plan["store_now"] == {"local": False, "objects": 3, "bytes": 3000}
        assert plan["bucket_mb"] > plan["local_mb"] > 0
        assert list(plan["disk_free_mb"]) == [str(tmp_path / "cache")]  # only the cache
