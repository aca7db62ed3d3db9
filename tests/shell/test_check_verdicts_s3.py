"""A check stands on its recorded passes with the store in a bucket as on a disk: the three
runs of test_check_verdicts.py with `--data-dir s3://...` on an S3-compatible server on
loopback (moto's server mode). The verdict path's store calls (the manifest's bytes, the
version's objects re-hashed, the recorded version's `content_sha256` read back) all go to
the bucket. Run by `make test-slow` and `make test-cluster`; needs the `cluster` extra."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from megacpp_pipeline.pipeline.checks import VERIFIED
from tests.fixtures.s3_server import CREDENTIALS, NEEDS_S3_SERVER, moto_bucket
from tests.fixtures.verdict_runs import three_runs

pytestmark = NEEDS_S3_SERVER

BUCKET = "megacpp-verdicts"


@pytest.fixture(scope="module")
def passes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[dict[str, object]]]:
    with moto_bucket(BUCKET) as endpoint:
        root = tmp_path_factory.mktemp("verdicts_s3")
        uri = f"s3://{BUCKET}/run?endpoint_override={endpoint}&scheme=http"
        yield three_runs(root, uri, CREDENTIALS)


def test_runs_on_a_bucket_stand_on_the_gate_then_the_record_then_read_the_changed_file(
    passes: list[dict[str, object]],
) -> None:
    first, second, third = passes
    read = first["files_scanned_by_gate"]  # the gate's pass, in the check's process
    assert isinstance(read, int) and read > 0
    assert first["files_rescanned"] == 0 and first["files_trusted"] == 0
    assert set(first[VERIFIED]) == {"tree", "repo"}  # type: ignore[arg-type]
    assert second["files_rescanned"] == 0 and second["files_trusted"] == read
    assert second[VERIFIED] == first[VERIFIED]
    assert third["files_rescanned"] == 1 and third["files_trusted"] == read - 1
