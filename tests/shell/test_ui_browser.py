"""The Dagster UI is how a person materializes a snapshot: `dagster dev` started as `make ui`
starts it (on a free loopback port), a real chromium opens the asset graph, clicks
"Materialize all", launches the backfill the UI offers, and finds the snapshot materialized
with every promotion check green. Screenshots go to test-artifacts/ui/."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from megacpp_pipeline.pipeline.runner import checks_of
from megacpp_pipeline.stages import default_registry
from tests.fixtures.browser_setup import (
    CHROMIUM_ARGS,
    REPO,
    DagsterDev,
    find_or_install_chromium,
    free_port,
    listening_addresses,
    make_ui_recipe,
    start_dagster_dev,
    wait_until_serving,
)
from tests.fixtures.pipeline_corpus import write_catalog

pytestmark = pytest.mark.browser

ARTIFACTS = REPO / "test-artifacts" / "ui"
BACKFILL_BOUND_S = 25 * 60  # two loaded cores, one subprocess per step

# What the UI must show, from the registry the asset graph is generated from (a hand-written
# list here went stale as gates were inserted): each stage in its group, and the snapshot's
# blocking checks (the standard ones and every promotion check).
GROUPS: dict[str, list[str]] = {}
for _stage in default_registry():
    GROUPS.setdefault(_stage.group, []).append(_stage.name)
SNAPSHOT_CHECKS = len(checks_of(default_registry().get("snapshot")))

_ASSETS_QUERY = """
{ assetNodes { assetKey { path } groupName isPartitioned description
    kinds owners { ... on TeamAssetOwner { team } ... on UserAssetOwner { email } }
    assetChecksOrError { ... on AssetChecks { checks { name blocking } } } } }
"""

_BACKFILLS_QUERY = """
{ partitionBackfillsOrError { ... on PartitionBackfills { results {
    id status numPartitions isAssetBackfill } } } }
"""

_BACKFILL_QUERY = """
query ($id: String!) { partitionBackfillOrError(backfillId: $id) {
  ... on PartitionBackfill { id status error { message }
    assetBackfillData { assetBackfillStatuses {
      ... on AssetPartitionsStatusCounts { assetKey { path } numPartitionsTargeted
            numPartitionsMaterialized numPartitionsFailed }
      ... on UnpartitionedAssetStatus { assetKey { path } materialized failed } } } } } }
"""

_SNAPSHOT_CHECKS_QUERY = """
{ assetNodeOrError(assetKey: {path: ["snapshot"]}) { ... on AssetNode {
    assetMaterializations(limit: 1) { runId metadataEntries { label
      ... on PathMetadataEntry { path } } }
    assetChecksOrError { ... on AssetChecks { checks { name
      executionForLatestMaterialization { status runId evaluation { success } } } } } } } }
"""


@pytest.fixture(scope="module")
def chromium() -> str:
    path, why = find_or_install_chromium()
    if path is None:
        print(f"SKIP browser test: {why}")
        pytest.skip(why)
    try:
        import playwright  # noqa: F401
    except ImportError:
        why = "python playwright is not installed (pip install -e '.[dev]')"
        print(f"SKIP browser test: {why}")
        pytest.skip(why)
    return path


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory, chromium: str) -> Iterator[dict[str, Any]]:
    """`make ui`'s own recipe lines (port swapped for a free one), with the test corpus."""
    started = time.monotonic()
    root = tmp_path_factory.mktemp("ui")
    catalog, _ = write_catalog(root)
    home = root / "dagster_home"
    recipe = make_ui_recipe(home)
    port = free_port()
    dev_line = next(line for line in recipe if " dev " in line)
    assert "-h 127.0.0.1 -p 3000 -w workspace.yaml" in dev_line, recipe
    for line in recipe:
        if line is not dev_line:
            subprocess.run(line, shell=True, cwd=REPO, check=True)  # mkdir, cp dagster.yaml
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "MEGACPP_CONFIG": str(catalog),
        "MEGACPP_DATA_DIR": str(root / "data"),
        "MEGACPP_CACHE_DIR": str(root / "cache"),
    }
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("*.png"):
        old.unlink()
    dev = start_dagster_dev(
        dev_line.replace("-p 3000", f"-p {port}"), env, ARTIFACTS / "dagster-dev.log", port
    )
    try:
        wait_until_serving(dev, timeout=300)
        yield {"dev": dev, "root": root, "home": home, "started": started, "chromium": chromium}
    finally:
        dev.stop()
        print(f"UI test wall time: {time.monotonic() - started:.0f}s")


@pytest.fixture(scope="module")
def page(ui: dict[str, Any]) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=ui["chromium"], headless=True, args=CHROMIUM_ARGS
        )
        pg = browser.new_page(viewport={"width": 1600, "height": 1000})
        pg.set_default_timeout(120_000)
        try:
            yield pg
        finally:
            browser.close()


def _open(page: Any, dev: DagsterDev, path: str, ready_text: str) -> None:
    page.goto(f"{dev.url}{path}")
    page.get_by_text(ready_text, exact=True).first.wait_for()
    page.wait_for_timeout(1500)
    skip = page.get_by_role("button", name="Skip")  # the first-visit community dialog
    if skip.count():
        skip.first.click()
        page.wait_for_timeout(500)


def _shot(page: Any, name: str) -> Path:
    path = ARTIFACTS / name
    page.screenshot(path=str(path))
    return path


@pytest.mark.timeout(600)
def test_webserver_binds_loopback_only(ui: dict[str, Any]) -> None:
    dev: DagsterDev = ui["dev"]
    addresses = listening_addresses(dev.port)
    assert addresses, f"nothing listens on {dev.port}"
    assert set(addresses) <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}, addresses


@pytest.mark.timeout(600)
def test_asset_graph_shows_every_gate_grouped_with_its_checks(
    ui: dict[str, Any], page: Any
) -> None:
    dev: DagsterDev = ui["dev"]
    nodes = {n["assetKey"]["path"][-1]: n for n in dev.graphql(_ASSETS_QUERY)["assetNodes"]}
    for group, assets in GROUPS.items():
        for asset in assets:
            node = nodes[asset]
            assert node["groupName"] == group, (asset, node["groupName"])
            assert node["description"], f"{asset} has no description"
            assert node["kinds"], f"{asset} has no kinds"
            assert node["owners"], f"{asset} has no owners"
            checks = node["assetChecksOrError"]["checks"]
            assert any(c["blocking"] for c in checks), f"{asset} has no blocking check"
    assert set(nodes) == {a for assets in GROUPS.values() for a in assets}

    _open(page, dev, "/asset-groups", "Materialize all…")
    page.locator("button:has([aria-label='settings'])").last.click()
    page.get_by_role("menuitem", name="Expand all groups").click()
    page.get_by_text("tokenized_docs", exact=True).first.wait_for()
    page.keyboard.press("Escape")  # close the settings menu before the picture
    page.mouse.click(700, 900)
    page.wait_for_timeout(1500)
    _shot(page, "01-asset-graph-before.png")
    body = page.inner_text("body")
    for group, assets in GROUPS.items():
        assert group in body
        for asset in assets:
            assert _drawn(asset, body), f"{asset} is not drawn in the asset graph"

    # Each group's own graph, zoomed in far enough that every node shows its checks row, in
    # a viewport tall enough for the whole group (the gates group is nine nodes on six rows;
    # a node outside the viewport is not drawn at all)
    page.set_viewport_size({"width": 2400, "height": 2000})
    for i, (group, assets) in enumerate(GROUPS.items(), start=2):
        _open(page, dev, f"/locations/megacpp_pipeline/asset-groups/{group}/lineage", assets[0])
        page.locator("button:has([aria-label='zoom_in'])").first.click()
        page.get_by_text("Asset checks").first.wait_for()
        page.wait_for_timeout(1000)
        _shot(page, f"0{i}-group-{group}.png")
        drawn = page.get_by_text("Asset checks").count()
        assert drawn >= len(assets), f"{group}: {drawn} nodes show checks, want {len(assets)}"
    page.set_viewport_size({"width": 1600, "height": 1000})


def _drawn(name: str, text: str) -> bool:
    """`name` is in the page's text whole, or as the UI draws a long one: middle-truncated,
    "decontamina…_files" (its head and tail, one ellipsis between)."""
    if name in text:
        return True
    for line in text.split("\n"):
        head, sep, tail = line.strip().partition("…")
        if sep and head and tail and name.startswith(head) and name.endswith(tail):
            return len(head) + len(tail) < len(name)
    return False


def test_drawn_accepts_a_middle_truncated_name_and_nothing_else() -> None:
    text = "gates\ndecontamina…_files\nscrubbed_files"
    assert _drawn("decontaminated_files", text) and _drawn("scrubbed_files", text)
    assert not _drawn("deduped_files", text) and not _drawn("decontaminated_rows", text)


def _backfill_status(dev: DagsterDev, backfill_id: str) -> dict[str, Any]:
    data = dev.graphql(_BACKFILL_QUERY, {"id": backfill_id})
    return data["partitionBackfillOrError"]  # type: ignore[no-any-return]


def _asset_done(status: dict[str, Any]) -> bool:
    if "materialized" in status:
        return bool(status["materialized"])
    return bool(status["numPartitionsMaterialized"] == status["numPartitionsTargeted"])


@pytest.mark.timeout(BACKFILL_BOUND_S + 600)
def test_materialize_all_from_the_ui_promotes_a_snapshot_with_green_checks(
    ui: dict[str, Any], page: Any
) -> None:
    dev: DagsterDev = ui["dev"]
    all_assets = [a for assets in GROUPS.values() for a in assets]

    _open(page, dev, "/asset-groups", "Materialize all…")
    page.get_by_role("button", name="Materialize all…").click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_role("button", name="All", exact=True).click()
    dialog.get_by_text("2 partitions").wait_for()
    _shot(page, "06-launch-backfill-dialog.png")
    assert f"Launch runs to materialize {len(all_assets)} assets" in dialog.inner_text()
    dialog.get_by_role("button", name="Launch backfill").click()

    deadline = time.monotonic() + 120
    backfills: list[dict[str, Any]] = []
    while not backfills and time.monotonic() < deadline:
        backfills = dev.graphql(_BACKFILLS_QUERY)["partitionBackfillsOrError"]["results"]
        time.sleep(2)
    assert len(backfills) == 1, f"the UI launched {len(backfills)} backfills"
    backfill_id = backfills[0]["id"]
    assert backfills[0]["isAssetBackfill"] and backfills[0]["numPartitions"] == 2

    # Every asset is in the backfill's target, partitioned ones with both sources.
    statuses = _backfill_status(dev, backfill_id)["assetBackfillData"]["assetBackfillStatuses"]
    targeted = {s["assetKey"]["path"][-1]: s for s in statuses}
    assert set(targeted) == set(all_assets), sorted(set(all_assets) - set(targeted))

    _open(page, dev, f"/runs/b/{backfill_id}", "source_catalog")
    progress_shot = False
    deadline = time.monotonic() + BACKFILL_BOUND_S
    while True:
        backfill = _backfill_status(dev, backfill_id)
        statuses = backfill["assetBackfillData"]["assetBackfillStatuses"]
        done = {s["assetKey"]["path"][-1] for s in statuses if _asset_done(s)}
        failed = [
            s["assetKey"]["path"][-1]
            for s in statuses
            if s.get("failed") or s.get("numPartitionsFailed")
        ]
        if failed:
            page.reload()
            page.wait_for_timeout(3000)
            _shot(page, "07-backfill-FAILED.png")
        assert not failed, f"backfill failed at {failed}:\n{dev.log_tail()}"
        if not progress_shot and "scrubbed_files" in done:
            page.reload()
            page.get_by_text("scrubbed_files").first.wait_for()
            page.wait_for_timeout(3000)
            _shot(page, "07-backfill-in-progress.png")
            progress_shot = True
        if backfill["status"] not in ("REQUESTED", "CANCELING"):  # its runs have all ended
            break
        assert time.monotonic() < deadline, (
            f"backfill not done after {BACKFILL_BOUND_S}s; done: {sorted(done)}\n{dev.log_tail()}"
        )
        time.sleep(10)
    assert backfill["status"] == "COMPLETED_SUCCESS", backfill
    assert done == set(all_assets), sorted(set(all_assets) - done)

    # A fresh browser context: the backfill page of the old one may keep its cached status.
    context = page.context.browser.new_context(viewport={"width": 1600, "height": 1200})
    done_page = context.new_page()
    done_page.set_default_timeout(120_000)
    done_page.goto(f"{dev.url}/runs/b/{backfill_id}")
    done_page.get_by_text("quality_report").first.wait_for()
    done_page.wait_for_timeout(3000)
    _shot(done_page, "08-backfill-completed.png")
    assert done_page.get_by_text("100% completed").count() == len(all_assets)
    context.close()

    # The snapshot's checks, as the UI shows them.
    _open(page, dev, "/assets/snapshot?view=checks", "snapshot")
    data = dev.graphql(_SNAPSHOT_CHECKS_QUERY)["assetNodeOrError"]
    checks = data["assetChecksOrError"]["checks"]
    assert len(checks) == SNAPSHOT_CHECKS
    for check in checks:  # drawn, if middle-truncated: its full name is in the DOM
        page.get_by_text(check["name"], exact=True).first.wait_for(state="attached")
    page.wait_for_timeout(2000)
    _shot(page, "09-snapshot-checks-green.png")
    body = page.inner_text("body")
    assert "Failed" not in body, body[:3000]
    assert body.count("Succeeded") >= SNAPSHOT_CHECKS, body[:3000]  # the list, one per check
    assert "Passed" in body  # the selected check's latest evaluation

    # Cross-check through the GraphQL API and on disk.
    run_id = data["assetMaterializations"][0]["runId"]
    for check in checks:
        execution = check["executionForLatestMaterialization"]
        assert execution is not None, f"{check['name']} never ran"
        assert execution["status"] == "SUCCEEDED", (check["name"], execution)
        assert execution["evaluation"]["success"] is True, check["name"]
        assert execution["runId"] == run_id, check["name"]
    snapshot_dir = next(
        Path(e["path"])
        for e in data["assetMaterializations"][0]["metadataEntries"]
        if e["label"] == "snapshot_dir"
    )
    assert snapshot_dir.parent == ui["root"] / "data" / "snapshots"
    assert (snapshot_dir / "_COMPLETE").exists()
    assert list((snapshot_dir / "train").glob("part-*.parquet"))
