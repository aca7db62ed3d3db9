"""Identity sums: the same files in any order and split into any parts give the same sums;
a file listed twice in place of another does not."""

from __future__ import annotations

from megacpp_pipeline.core.identity import NONE, added, identity_sums

SOURCES = ["fmt", "fmt", "zlib", "zlib"]
PATHS = ["include/fmt/core.h", "src/format.cc", "zlib.h", "inflate.c"]


def test_the_sums_do_not_depend_on_order_or_on_how_the_files_are_split():
    whole = identity_sums(SOURCES, PATHS)
    assert whole != NONE
    assert identity_sums(SOURCES[::-1], PATHS[::-1]) == whole
    parts = [identity_sums(SOURCES[:1], PATHS[:1]), identity_sums(SOURCES[1:], PATHS[1:])]
    assert added(parts) == whole
    assert added([]) == NONE == identity_sums([], [])


def test_a_file_listed_twice_instead_of_another_changes_the_sums():
    twice = identity_sums(SOURCES, [*PATHS[:3], PATHS[2]])
    assert twice != identity_sums(SOURCES, PATHS)
    # the source is part of the identity: the same path in another source is another file
    assert identity_sums(["fmt"], ["zlib.h"]) != identity_sums(["zlib"], ["zlib.h"])
