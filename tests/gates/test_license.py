"""The license gate, specified by real expressions and headers seen in C/C++ trees, REUSE
metadata handled by FSFE's reuse package, and the policy that decides what enters."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from megacpp_pipeline.core import schemas
from megacpp_pipeline.core.ledger import LEDGER_SCHEMA, DropReason
from megacpp_pipeline.gates.license import (
    Combination,
    LicenseConfig,
    LicenseInputError,
    LicensePolicy,
    LicenseTerm,
    decide,
    find_spdx_identifiers,
    is_reuse_metadata_path,
    leading_comments,
    markdown_summary,
    match_notice,
    parse_expression,
    run,
    spdx_lists,
)
from tests.fixtures import real_cpp

CODE = """
#ifndef DEMO_H
#define DEMO_H
namespace demo { inline int answer() { return 42; } }
#endif
"""

BOOST_NOTICE = """\
//  (C) Copyright John Maddock 2001 - 2003.
//  Distributed under the Boost
//  Software License, Version 1.0. (See accompanying file
//  LICENSE_1_0.txt or copy at http://www.boost.org/LICENSE_1_0.txt)
"""

BOOST_PP_NOTICE = """\
# /* Copyright (C) 2001
#  * Housemarque Oy
#  *
#  * Distributed under the Boost Software License, Version 1.0. (See
#  * accompanying file LICENSE_1_0.txt or copy at
#  * http://www.boost.org/LICENSE_1_0.txt)
#  */
#
# ifndef BOOST_PREPROCESSOR_ARITHMETIC_ADD_HPP
"""

LLVM_HEADER = """\
// -*- C++ -*-
//===----------------------------------------------------------------------===//
//
// Part of the LLVM Project, under the Apache License v2.0 with LLVM Exceptions.
// See https://llvm.org/LICENSE.txt for license information.
//
//===----------------------------------------------------------------------===//
"""

MIT_TEXT = """\
/*
 * Copyright (c) 2013-2022 Niels Lohmann
 *
 * Permission is hereby granted, free of charge, to any person obtaining a copy
 * of this software and associated documentation files (the "Software"), to deal
 * in the Software without restriction, including without limitation the rights
 * to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
 * copies of the Software, and to permit persons to whom the Software is
 * furnished to do so, subject to the following conditions:
 *
 * The above copyright notice and this permission notice shall be included in all
 * copies or substantial portions of the Software.
 *
 * THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND.
 */
"""

BSD_CLAUSES = """\
/*
Copyright (C) 2010-2021 Max-Planck-Society
All rights reserved.

Redistribution and use in source and binary forms, with or without modification,
are permitted provided that the following conditions are met:

* Redistributions of source code must retain the above copyright notice, this
  list of conditions and the following disclaimer.
* Redistributions in binary form must reproduce the above copyright notice, this
  list of conditions and the following disclaimer in the documentation and/or
  other materials provided with the distribution.
{third}
THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS".
*/
"""
BSD3_THIRD = """\
* Neither the name of the copyright holder nor the names of its contributors may
  be used to endorse or promote products derived from this software without
  specific prior written permission.
"""

APACHE_HEADER = """\
// Copyright 2020 Google LLC
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
//     http://www.apache.org/licenses/LICENSE-2.0
"""

ZLIB_TEXT = """\
/*
    pdqsort.hpp - Pattern-defeating quicksort.
    Copyright (c) 2015 Orson Peters

    This software is provided 'as-is', without any express or implied warranty.
   In no event will the
    authors be held liable for any damages arising from the use of this
   software.

    Permission is granted to anyone to use this software for any purpose,
   including commercial
    applications, and to alter it and redistribute it freely, subject to the
   following restrictions:

    1. The origin of this software must not be misrepresented; you must not
   claim that you wrote the original software.
*/
"""

ISC_TEXT = """\
/*
 * Copyright (c) 2004 Internet Systems Consortium, Inc. ("ISC")
 *
 * Permission to use, copy, modify, and/or distribute this software for any
 * purpose with or without fee is hereby granted, provided that the above
 * copyright notice and this permission notice appear in all copies.
 *
 * THE SOFTWARE IS PROVIDED "AS IS" AND ISC DISCLAIMS ALL WARRANTIES
 */
"""
# ISC's own header names ISC as "the author"; the standard template says "THE AUTHOR".
ISC_TEXT = ISC_TEXT.replace("AND ISC DISCLAIMS", "AND THE AUTHOR DISCLAIMS")

MPL_HEADER = """\
/* This Source Code Form is subject to the terms of the Mozilla Public
 * License, v. 2.0. If a copy of the MPL was not distributed with this
 * file, You can obtain one at http://mozilla.org/MPL/2.0/. */
"""

XSIMD_HEADER = """\
/***************************************************************************
 * Copyright (c) Johan Mabille, Sylvain Corlay, Wolf Vollprecht and         *
 * Martin Renou                                                             *
 *                                                                          *
 * Distributed under the terms of the BSD 3-Clause License.                 *
 *                                                                          *
 * The full license is in the file LICENSE, distributed with this software. *
 ****************************************************************************/
"""


def normalized_table(files: dict[str, str], source_id: str = "demo") -> pa.Table:
    rows = [
        {
            "source_id": source_id,
            "path": path,
            "revision": "0" * 40,
            "blob_sha": schemas.git_blob_sha(text.encode()),
            "size": len(text.encode()),
            "encoding": "utf-8",
            "text": text,
            "content_sha256": schemas.text_sha256(text),
            "language": "c++",
            "vendored": False,
        }
        for path, text in files.items()
    ]
    return pa.Table.from_pylist(rows, schema=schemas.CLASSIFIED_FILES)


def license_gate(
    files: dict[str, str],
    declared: str | None = "MIT",
    reuse_files: dict[str, str] | None = None,
    record_licenses: dict[str, str] | None = None,
    **policy: object,
):
    """Run the gate; return (rows by path for every file, GateResult)."""
    config = LicenseConfig(policy=LicensePolicy(**policy))  # type: ignore[arg-type]
    result = run(
        normalized_table(files),
        config,
        declared_license=declared,
        reuse_files={k: v.encode() for k, v in (reuse_files or {}).items()},
        record_licenses=record_licenses,
    )
    assert result.kept.schema.equals(schemas.LICENSED_FILES)
    assert result.dropped.schema.equals(LEDGER_SCHEMA)
    rows = {}
    for row in result.kept.to_pylist():
        rows[row["path"]] = (
            row["license_decision"],
            row["license_source"],
            row["license_expression"],
        )
    for row in result.dropped.to_pylist():
        decision = {
            DropReason.LICENSE_DENIED: "denied",
            DropReason.LICENSE_INVALID: "invalid",
            DropReason.LICENSE_UNKNOWN: "unknown",
        }[DropReason(row["reason"])]
        rows[row["path"]] = (decision, row["detail"].split(":")[0], row["license_expression"])
    assert len(rows) == len(files), "every file is kept or in the ledger"
    return rows, result


# ---------------------------------------------------------------------------------------
# Expressions


@pytest.mark.parametrize(
    ("text", "normalized", "decision"),
    [
        ("Apache-2.0 WITH LLVM-exception", "Apache-2.0 WITH LLVM-exception", "allowed"),
        ("BSL-1.0", "BSL-1.0", "allowed"),
        ("(MIT OR CC0-1.0)", "MIT OR CC0-1.0", "allowed"),
        (
            "LGPL-2.1-only WITH Qt-LGPL-exception-1.1 OR LicenseRef-Qt-Commercial",
            "LGPL-2.1-only WITH Qt-LGPL-exception-1.1 OR LicenseRef-Qt-Commercial",
            "denied",
        ),
        (
            "GPL-3.0-or-later WITH GCC-exception-3.1",
            "GPL-3.0-or-later WITH GCC-exception-3.1",
            "denied",
        ),
        ("mit", "MIT", "allowed"),
        ("MIT OR Apache-2.0 AND GPL-3.0-only", "MIT OR Apache-2.0 AND GPL-3.0-only", "allowed"),
        (
            "(MIT OR GPL-3.0-only) AND GPL-2.0-only",
            "(MIT OR GPL-3.0-only) AND GPL-2.0-only",
            "denied",
        ),
        (
            "Apache-2.0 WITH Classpath-exception-2.0",
            "Apache-2.0 WITH Classpath-exception-2.0",
            "denied",
        ),
        ("Apache-2.0+", "Apache-2.0+", "allowed"),
        (
            "DocumentRef-spdx-tool-1.2:LicenseRef-MIT-Style-2",
            "DocumentRef-spdx-tool-1.2:LicenseRef-MIT-Style-2",
            "denied",
        ),
    ],
)
def test_real_expressions_parse_normalize_and_decide(text, normalized, decision):
    parsed = parse_expression(text)
    assert parsed.is_valid, parsed.errors
    assert parsed.normalized == normalized
    assert decide(parsed, LicensePolicy()).decision == decision


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("MIT AND NotARealLicense", "'NotARealLicense' is not an SPDX licence id"),
        ("Apache-2.0 WITH Made-Up-exception", "'Made-Up-exception' is not an SPDX exception id"),
        ("MIT OR", "does not parse"),
        ("MIT AND BSD-3-Clause AND", "'AND' lacks an operand"),  # the library drops it
        ("MIT OR BSD-3-Clause OR", "'OR' lacks an operand"),
        ("AND MIT", "'AND' lacks an operand"),
        ("(MIT AND) OR BSD-3-Clause", "lacks an operand"),
        ("MIT OR OR BSD-3-Clause", "lacks an operand"),
        ("(MIT", "does not parse"),
        ("", "empty expression"),
        ("LLVM-exception", "is an exception, used as a licence"),
        ("MIT WITH Apache-2.0", "is a licence, used as a WITH exception"),
        ("bsd-new", "not an SPDX licence id"),  # a ScanCode key, not an SPDX id
        ("boost-1.0", "not an SPDX licence id"),
    ],
)
def test_bad_expressions_are_invalid_with_the_reason(text, error):
    parsed = parse_expression(text)
    assert not parsed.is_valid
    assert any(error in message for message in parsed.errors), parsed.errors
    assert decide(parsed, LicensePolicy()).decision == "invalid"


@pytest.mark.parametrize(
    ("text", "normalized", "flag"),
    [
        ("GPL-2.0", "GPL-2.0-only", "GPL-2.0 -> GPL-2.0-only"),
        ("GPL-2.0+", "GPL-2.0-or-later", "GPL-2.0+ -> GPL-2.0-or-later"),
        (
            "LGPL-2.1+ WITH Classpath-exception-2.0",
            "LGPL-2.1-or-later WITH Classpath-exception-2.0",
            "LGPL-2.1+ -> LGPL-2.1-or-later",
        ),
        ("BSD-2-Clause-FreeBSD", "BSD-2-Clause", "BSD-2-Clause-FreeBSD -> BSD-2-Clause"),
    ],
)
def test_deprecated_ids_are_recognised_normalized_and_flagged(text, normalized, flag):
    parsed = parse_expression(text)
    assert parsed.is_valid
    assert parsed.normalized == normalized
    assert parsed.deprecated == (flag,)


def test_and_binds_tighter_than_or():
    tree = parse_expression("MIT OR Apache-2.0 AND BSD-3-Clause").tree
    assert tree == Combination(
        "OR",
        (
            LicenseTerm("MIT"),
            Combination("AND", (LicenseTerm("Apache-2.0"), LicenseTerm("BSD-3-Clause"))),
        ),
    )


def test_listed_licenseref_is_allowed_by_policy():
    policy = LicensePolicy(allowed_licenserefs=["LicenseRef-Qt-Commercial"])
    decision = decide(
        "LGPL-2.1-only WITH Qt-LGPL-exception-1.1 OR LicenseRef-Qt-Commercial", policy
    )
    assert decision.decision == "allowed"
    assert decision.reason == "allowed via LicenseRef-Qt-Commercial"


def test_with_needs_the_exception_allowed_too():
    policy = LicensePolicy(allowed_licenses=["GPL-3.0-or-later"])
    assert decide("GPL-3.0-or-later WITH GCC-exception-3.1", policy).decision == "denied"
    policy = LicensePolicy(
        allowed_licenses=["GPL-3.0-or-later"], allowed_exceptions=["GCC-exception-3.1"]
    )
    assert decide("GPL-3.0-or-later WITH GCC-exception-3.1", policy).decision == "allowed"


def test_policy_refuses_ids_that_are_not_spdx_when_it_loads():
    with pytest.raises(ValidationError, match="allowed_licenses"):
        LicensePolicy(allowed_licenses=["MIT", "BSD"])
    with pytest.raises(ValidationError, match="allowed_exceptions"):
        LicensePolicy(allowed_exceptions=["Made-Up-exception"])
    with pytest.raises(ValidationError, match="allowed_licenserefs"):
        LicensePolicy(allowed_licenserefs=["Qt-Commercial"])


def test_pinned_lists_record_their_version_and_hold_only_spdx_ids():
    lists = spdx_lists()
    assert lists.version == "3.27.0"
    assert "mit" in lists.licenses and "llvm-exception" in lists.exceptions
    assert not any(key.startswith("licenseref-scancode") for key in lists.licenses)


_IDS = sorted(key for key in spdx_lists().licenses.values() if key not in spdx_lists().deprecated)
_EXCEPTIONS = sorted(
    key for key in spdx_lists().exceptions.values() if key not in spdx_lists().deprecated
)
_terms = st.builds(
    LicenseTerm,
    license=st.sampled_from(_IDS)
    | st.from_regex(r"LicenseRef-[A-Za-z0-9][A-Za-z0-9.\-]{0,12}", fullmatch=True),
    or_later=st.booleans(),
    exception=st.none() | st.sampled_from(_EXCEPTIONS),
).filter(lambda t: not (t.or_later and t.license.startswith("LicenseRef-")))


def _combinations(children: st.SearchStrategy) -> st.SearchStrategy:
    def build(operator: str, parts: list) -> Combination:
        flat: list = []
        for part in parts:  # canonical trees: no AND directly inside AND, no duplicates
            same = isinstance(part, Combination) and part.operator == operator
            items = part.parts if same else (part,)
            flat.extend(item for item in items if item not in flat)
        return Combination(operator, tuple(flat))  # type: ignore[arg-type]

    return st.builds(
        build, st.sampled_from(["AND", "OR"]), st.lists(children, min_size=2, max_size=4)
    ).filter(lambda c: len(c.parts) >= 2)


_expressions = st.recursive(_terms, _combinations, max_leaves=8)


@pytest.mark.filterwarnings("ignore:Generating overly large repr")
@settings(max_examples=150, deadline=None)
@given(_expressions)
def test_random_valid_expressions_round_trip_through_parse_and_render(tree):
    text = tree.render()
    parsed = parse_expression(text)
    assert parsed.is_valid, (text, parsed.errors)
    assert parsed.tree == tree
    assert parsed.normalized == text


# ---------------------------------------------------------------------------------------
# Where a file's licence is written


def test_spdx_tag_in_leading_comment_is_found():
    text = "// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception\n" + CODE
    assert find_spdx_identifiers(text) == ["Apache-2.0 WITH LLVM-exception"]


def test_several_tag_lines_are_all_found_in_order():
    text = "/*\n * SPDX-License-Identifier: MIT\n * SPDX-License-Identifier: BSL-1.0\n */\n" + CODE
    assert find_spdx_identifiers(text) == ["MIT", "BSL-1.0"]


def test_lowercase_tag_counts():
    assert find_spdx_identifiers("// spdx-license-identifier: BSL-1.0\n" + CODE) == ["BSL-1.0"]


def test_single_line_block_comment_tag_loses_its_terminator():
    assert find_spdx_identifiers("/* SPDX-License-Identifier: Zlib */\n" + CODE) == ["Zlib"]


def test_tag_after_include_guard_and_pragma_counts():
    text = "#pragma once\n#ifndef X_H\n#define X_H\n// SPDX-License-Identifier: ISC\n" + CODE
    assert find_spdx_identifiers(text) == ["ISC"]


def test_identifier_inside_a_string_literal_in_code_does_not_count():
    text = (
        "#include <cstdio>\n"
        "int main() {\n"
        '  std::puts("SPDX-License-Identifier: GPL-3.0-only");\n'
        "  // SPDX-License-Identifier: GPL-3.0-only\n"
        "}\n"
    )
    assert find_spdx_identifiers(text) == []


@pytest.mark.parametrize(
    ("expression", "cut_after"),
    [
        ("MIT AND GPL-3.0-only", "MIT"),
        ("BSD-3-Clause AND LicenseRef-Proprietary", "BSD-3-Clause"),
        ("Apache-2.0 WITH LLVM-exception", "Apache-2.0"),
    ],
)
def test_a_tag_line_crossing_the_4_kib_head_is_read_whole(expression, cut_after):
    """Cut at the limit, `MIT AND GPL-3.0-only` passed for MIT: the line is read to its end."""
    tag = "// SPDX-License-Identifier: " + expression
    pad = 4096 - (tag.index(cut_after) + len(cut_after))
    head = "// Copyright (c) contributors.\n" * (pad // 32)
    head += "//" + " " * (pad - len(head) - 3) + "\n"
    text = head + tag + "\n" + CODE
    assert text[:4096].endswith(cut_after)
    assert find_spdx_identifiers(text) == [expression]
    rows, _ = license_gate({"x.h": text}, declared=None)
    assert rows["x.h"][2] == parse_expression(expression).normalized


def test_tags_reuse_says_to_ignore_are_not_the_files_licence():
    """REUSE-IgnoreStart .. REUSE-IgnoreEnd (REUSE 3.x, "Ignoring parts of a file"): an
    example tag there neither adds to the file's own tag nor stands in for a missing one."""
    example = (
        "// SPDX-License-Identifier: MIT\n// Generated files say:\n// REUSE-IgnoreStart\n"
        "// SPDX-License-Identifier: LicenseRef-Customer-Proprietary\n// REUSE-IgnoreEnd\n"
    )
    assert find_spdx_identifiers(example + CODE) == ["MIT"]
    unclosed = "// REUSE-IgnoreStart\n// SPDX-License-Identifier: MIT\n"
    assert find_spdx_identifiers(unclosed + CODE) == []
    only_ignored = "/* REUSE-IgnoreStart SPDX-License-Identifier: MIT REUSE-IgnoreEnd */\n"
    toml = REUSE_TOML.format(path="**", precedence="closest", license="GPL-3.0-only")
    rows, _ = license_gate({"lint.cpp": only_ignored + CODE}, reuse_files={"REUSE.toml": toml})
    assert rows["lint.cpp"] == ("denied", "reuse", "GPL-3.0-only")


def test_tag_beyond_the_first_4_kib_does_not_count():
    text = "// " + "x" * 5000 + "\n// SPDX-License-Identifier: MIT\n" + CODE
    assert find_spdx_identifiers(text) == []


@pytest.mark.parametrize(
    ("header", "expression"),
    [
        (BOOST_NOTICE, "BSL-1.0"),
        (BOOST_PP_NOTICE, "BSL-1.0"),
        (LLVM_HEADER, "Apache-2.0 WITH LLVM-exception"),
        (MIT_TEXT, "MIT"),
        (BSD_CLAUSES.format(third=BSD3_THIRD), "BSD-3-Clause"),
        (BSD_CLAUSES.format(third=""), "BSD-2-Clause"),
        (APACHE_HEADER, "Apache-2.0"),
        (ZLIB_TEXT, "Zlib"),
        (ISC_TEXT, "ISC"),
        (MPL_HEADER, "MPL-2.0"),
        (XSIMD_HEADER, "BSD-3-Clause"),
    ],
)
def test_standard_notices_are_recognised(header, expression):
    assert match_notice(header + CODE) == expression


@pytest.mark.parametrize(
    "header",
    [
        "/* Use of this source code is governed by a BSD-style license that can be found\n"
        "   in the LICENSE file. */\n",
        "// Licensed under the MIT license.\n",
        "// Copyright 2024 Example\n",
    ],
)
def test_vague_notices_are_not_guessed(header):
    assert match_notice(header + CODE) is None


def test_notice_after_the_first_code_does_not_count():
    assert match_notice(CODE + BOOST_NOTICE) is None


def test_notice_split_by_a_blank_line_and_a_directive_is_read_whole():
    text = (
        "//  Distributed under the Boost\n"
        "\n"
        "   //  Software License, Version 1.0. (See accompanying file\n"
        "#pragma once\n"
        "//  LICENSE_1_0.txt or copy at http://www.boost.org/LICENSE_1_0.txt)\n"
    )
    assert match_notice(text + CODE) == "BSL-1.0"


# The head read one token at a time: whitespace, then a // or /* */ comment, a `# /*` null
# directive or a preprocessor line. The gate reads a whole run of // lines per regex match
# (faster) and must find exactly these comments.
_HEAD_TOKEN = re.compile(
    r"\s*(?:(?P<line>//[^\n]*)|(?P<block>/\*.*?(?:\*/|\Z))"
    r"|\#[ \t]*(?=/[/*])|\#[^\n]*(?:\\\n[^\n]*)*)",
    re.DOTALL,
)


def _head(text: str, limit: int) -> str:
    """The head read for tags: to the end of the line that crosses `limit` (if that ends
    within 1 KiB), else to the start of that line."""
    if len(text) <= limit:
        return text
    newline = text.find("\n", limit, limit + 1024)
    return text[:newline] if newline >= 0 else text[: max(0, text.rfind("\n", 0, limit))]


def _comments_one_token_at_a_time(text: str, limit: int) -> list[str]:
    head, pos, comments = _head(text, limit), 0, []
    while (token := _HEAD_TOKEN.match(head, pos)) is not None:
        if token.lastgroup == "line":
            comments.append(token.group("line")[2:])
        elif token.lastgroup == "block":
            comments.append(token.group("block")[2:].removesuffix("*/"))
        pos = token.end()
    return comments


_HEAD_PIECES = ["//", "/*", "*/", "*", "/", "#", "# ", " ", "\t", "\n", "\\\n", "\r", "\u2028"]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from([*_HEAD_PIECES, "x", "SPDX-License-Identifier: MIT"])),
    st.integers(1, 60),
)
def test_leading_comments_are_the_comment_tokens_of_the_head(pieces, limit):
    text = "".join(pieces)
    assert leading_comments(text, limit) == _comments_one_token_at_a_time(text, limit)


# ---------------------------------------------------------------------------------------
# The gate


def test_vendored_boost_file_keeps_its_own_license():
    rows, _ = license_gate(
        {
            "pythran/boost/config.hpp": BOOST_NOTICE + CODE,
            "pythran/pythonic/core.hpp": CODE,
        },
        declared="BSD-3-Clause",
    )
    assert rows["pythran/boost/config.hpp"] == ("allowed", "notice-text", "BSL-1.0")
    assert rows["pythran/pythonic/core.hpp"] == ("allowed", "repo-declared", "BSD-3-Clause")


def test_vendored_gpl_subdirectory_is_denied_despite_a_permissive_repo():
    rows, result = license_gate(
        {
            "src/core.cpp": CODE,
            "third_party/readline/history.c": "/* SPDX-License-Identifier: GPL-3.0-or-later */\n"
            + CODE,
        },
        declared="MIT",
    )
    assert rows["src/core.cpp"] == ("allowed", "repo-declared", "MIT")
    assert rows["third_party/readline/history.c"] == ("denied", "file", "GPL-3.0-or-later")
    (ledger,) = result.dropped.to_pylist()
    assert ledger["reason"] == DropReason.LICENSE_DENIED
    assert "GPL-3.0-or-later is not on the allow list" in ledger["detail"]


def test_multi_line_identifiers_combine_with_and():
    text = "// SPDX-License-Identifier: MIT\n// SPDX-License-Identifier: Apache-2.0\n" + CODE
    rows, _ = license_gate({"a.cpp": text})
    assert rows["a.cpp"] == ("allowed", "file", "MIT AND Apache-2.0")


def test_file_tag_wins_over_a_notice_and_the_repo():
    text = "// SPDX-License-Identifier: BSL-1.0\n" + MIT_TEXT + CODE
    rows, _ = license_gate({"a.cpp": text}, declared="Apache-2.0")
    assert rows["a.cpp"] == ("allowed", "file", "BSL-1.0")


def test_invalid_expression_goes_to_the_ledger_not_the_shards():
    rows, result = license_gate(
        {"bad.h": "// SPDX-License-Identifier: MIT AND NotARealLicense\n" + CODE}
    )
    assert rows["bad.h"] == ("invalid", "file", "MIT AND NotARealLicense")
    assert result.kept.num_rows == 0
    (ledger,) = result.dropped.to_pylist()
    assert ledger["reason"] == DropReason.LICENSE_INVALID
    assert ledger["license_expression"] == "MIT AND NotARealLicense"
    assert "NotARealLicense" in ledger["detail"]


def test_truncated_expression_is_invalid():
    rows, _ = license_gate({"t.h": "// SPDX-License-Identifier: MIT OR\n" + CODE})
    assert rows["t.h"][0] == "invalid"


def test_deprecated_id_is_normalized_and_flagged_in_the_detail():
    policy = {"allowed_licenses": ["GPL-2.0-only"]}
    _, result = license_gate({"g.c": "// SPDX-License-Identifier: GPL-2.0\n" + CODE}, **policy)
    (row,) = result.kept.to_pylist()
    assert row["license_expression"] == "GPL-2.0-only"
    assert "deprecated: GPL-2.0 -> GPL-2.0-only" in row["license_detail"]


def test_repo_declared_fallback_can_be_switched_off():
    rows, result = license_gate({"a.cpp": CODE}, declared="MIT", allow_repo_declared=False)
    assert rows["a.cpp"] == ("unknown", "none", None)
    assert result.dropped.to_pylist()[0]["reason"] == DropReason.LICENSE_UNKNOWN


def test_a_record_licence_stands_in_for_the_declared_one_and_narrows_a_files_own():
    """A JSONL record's `license`: where the file says nothing it replaces the source's
    declared licence; where the file says, both must allow the file (a record can narrow,
    never widen)."""
    gpl_tagged = "// SPDX-License-Identifier: GPL-3.0-only\n" + CODE
    mit_tagged = "// SPDX-License-Identifier: MIT\n" + CODE
    rows, result = license_gate(
        {"bare.cpp": CODE, "gpl.cpp": gpl_tagged, "mit.cpp": mit_tagged, "plain.cpp": CODE},
        declared="MIT",
        record_licenses={"bare.cpp": "GPL-3.0-only", "gpl.cpp": "MIT", "mit.cpp": "GPL-3.0-only"},
    )
    assert rows["bare.cpp"] == ("denied", "record", "GPL-3.0-only")
    assert rows["gpl.cpp"] == ("denied", "file", "GPL-3.0-only AND MIT")
    assert rows["mit.cpp"] == ("denied", "file", "MIT AND GPL-3.0-only")
    assert rows["plain.cpp"] == ("allowed", "repo-declared", "MIT")  # no record licence
    detail = {r["path"]: r["detail"] for r in result.dropped.to_pylist()}
    assert "the licence its JSONL record declares" in detail["bare.cpp"]
    assert "the licence its JSONL record declares" in detail["mit.cpp"]
    rows, _ = license_gate({"bare.cpp": CODE}, record_licenses={"bare.cpp": "Apache-2.0"})
    assert rows["bare.cpp"] == ("allowed", "record", "Apache-2.0")
    # declared licences switched off: a record's cannot make a file allowed either
    rows, _ = license_gate(
        {"bare.cpp": CODE}, record_licenses={"bare.cpp": "MIT"}, allow_repo_declared=False
    )
    assert rows["bare.cpp"] == ("unknown", "none", None)
    rows, _ = license_gate({"bare.cpp": CODE}, record_licenses={"bare.cpp": "MIT OR"})
    assert rows["bare.cpp"][:2] == ("invalid", "record")


def test_no_declared_licence_and_no_metadata_is_unknown():
    rows, _ = license_gate({"a.cpp": CODE}, declared=None)
    assert rows["a.cpp"] == ("unknown", "none", None)


def test_invalid_declared_licence_makes_fallback_files_invalid():
    rows, _ = license_gate({"a.cpp": CODE, "b.hpp": BOOST_NOTICE + CODE}, declared="BSD")
    assert rows["a.cpp"] == ("invalid", "repo-declared", "BSD")
    assert rows["b.hpp"] == ("allowed", "notice-text", "BSL-1.0")


def test_stats_count_decisions_sources_and_expressions():
    _, result = license_gate(
        {
            "a.hpp": BOOST_NOTICE + CODE,
            "b.hpp": BOOST_NOTICE + CODE,
            "c.cpp": "// SPDX-License-Identifier: GPL-3.0-only\n" + CODE,
            "d.cpp": CODE,
        },
        declared="MIT",
    )
    stats = result.stats
    assert stats["decision:allowed"] == 3 and stats["decision:denied"] == 1
    assert stats["source:notice-text"] == 2 and stats["source:file"] == 1
    assert stats["source:repo-declared"] == 1
    assert stats["expr:BSL-1.0"] == 2 and stats["expr:GPL-3.0-only"] == 1
    assert stats["files_in"] == 4 and stats["files_kept"] == 3
    summary = markdown_summary(stats)
    assert "| decision | files |" in summary
    assert "| `BSL-1.0` | 2 |" in summary
    assert "**3 of 4 files allowed**" in summary


def test_a_table_without_text_is_refused_by_name():
    table = normalized_table({"a.h": CODE}).drop_columns(["text"])
    with pytest.raises(LicenseInputError, match="text"):
        run(table, LicenseConfig(), declared_license="MIT", reuse_files={})


# ---------------------------------------------------------------------------------------
# REUSE metadata


@pytest.mark.parametrize(
    ("path", "is_metadata"),
    [
        ("REUSE.toml", True),
        ("vendor/zlib/REUSE.toml", True),
        (".reuse/dep5", True),
        ("src/blob.bin.license", True),
        ("src/blob.h", False),
        ("LICENSE", False),
        ("LICENSES/MIT.txt", False),
        ("sub/.reuse/dep5", False),  # REUSE reads dep5 only at the root
    ],
)
def test_collector_keeps_exactly_the_reuse_metadata_files(path, is_metadata):
    assert is_reuse_metadata_path(path) is is_metadata


def test_license_sidecar_applies_to_its_file():
    rows, _ = license_gate(
        {"data/table.inc": CODE, "src/main.cpp": CODE},
        declared=None,
        reuse_files={"data/table.inc.license": "SPDX-License-Identifier: CC0-1.0\n"},
    )
    assert rows["data/table.inc"] == ("allowed", "reuse", "CC0-1.0")
    assert rows["src/main.cpp"] == ("unknown", "none", None)


def test_license_sidecar_replaces_the_files_own_tag():
    rows, _ = license_gate(
        {"a.h": "// SPDX-License-Identifier: GPL-3.0-only\n" + CODE},
        reuse_files={"a.h.license": "SPDX-License-Identifier: MIT\n"},
    )
    assert rows["a.h"] == ("allowed", "reuse", "MIT")


REUSE_TOML = """\
version = 1

[[annotations]]
path = "{path}"
precedence = "{precedence}"
SPDX-FileCopyrightText = "2024 Example"
SPDX-License-Identifier = "{license}"
"""


def test_reuse_toml_closest_yields_to_the_files_own_tag():
    toml = REUSE_TOML.format(path="src/**", precedence="closest", license="GPL-3.0-only")
    rows, _ = license_gate(
        {"src/tagged.cpp": "// SPDX-License-Identifier: MIT\n" + CODE, "src/plain.cpp": CODE},
        reuse_files={"REUSE.toml": toml},
    )
    assert rows["src/tagged.cpp"] == ("allowed", "file", "MIT")
    assert rows["src/plain.cpp"] == ("denied", "reuse", "GPL-3.0-only")


def test_reuse_toml_aggregate_adds_to_the_files_own_tag():
    toml = REUSE_TOML.format(path="src/*.cpp", precedence="aggregate", license="Apache-2.0")
    rows, _ = license_gate(
        {"src/a.cpp": "// SPDX-License-Identifier: MIT\n" + CODE},
        reuse_files={"REUSE.toml": toml},
    )
    decision, source, expression = rows["src/a.cpp"]
    assert (decision, source) == ("allowed", "reuse")
    assert set(expression.split(" AND ")) == {"MIT", "Apache-2.0"}


def test_reuse_toml_override_replaces_the_files_own_tag():
    toml = REUSE_TOML.format(path="**", precedence="override", license="BSL-1.0")
    rows, _ = license_gate(
        {"x/a.cpp": "// SPDX-License-Identifier: GPL-3.0-only\n" + CODE},
        reuse_files={"REUSE.toml": toml},
    )
    assert rows["x/a.cpp"] == ("allowed", "reuse", "BSL-1.0")


def test_nested_reuse_toml_of_a_vendored_directory_is_closest():
    root_toml = REUSE_TOML.format(path="**", precedence="closest", license="MIT")
    vendor_toml = REUSE_TOML.format(path="**", precedence="closest", license="Zlib")
    rows, _ = license_gate(
        {"src/a.cpp": CODE, "vendor/zlib/inflate.c": CODE},
        declared="Apache-2.0",
        reuse_files={"REUSE.toml": root_toml, "vendor/zlib/REUSE.toml": vendor_toml},
    )
    assert rows["src/a.cpp"] == ("allowed", "reuse", "MIT")
    assert rows["vendor/zlib/inflate.c"] == ("allowed", "reuse", "Zlib")


def test_files_outside_every_reuse_annotation_keep_their_own_sources():
    toml = REUSE_TOML.format(path="vendor/**", precedence="closest", license="GPL-2.0-only")
    rows, _ = license_gate(
        {
            "vendor/lib.c": CODE,
            "src/tagged.cpp": "// SPDX-License-Identifier: BSL-1.0\n" + CODE,
            "src/boost.hpp": BOOST_NOTICE + CODE,
            "src/plain.cpp": CODE,
        },
        declared="MIT",
        reuse_files={"REUSE.toml": toml},
    )
    assert rows["vendor/lib.c"] == ("denied", "reuse", "GPL-2.0-only")
    assert rows["src/tagged.cpp"] == ("allowed", "file", "BSL-1.0")
    assert rows["src/boost.hpp"] == ("allowed", "notice-text", "BSL-1.0")
    assert rows["src/plain.cpp"] == ("allowed", "repo-declared", "MIT")


def test_dep5_covers_a_vendored_directory():
    dep5 = (
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
        "Upstream-Name: demo\n\n"
        "Files: third_party/*\nCopyright: 2020 Someone\nLicense: GPL-2.0-only\n"
    )
    rows, _ = license_gate(
        {"third_party/lib.c": CODE, "src/main.cpp": CODE},
        declared="MIT",
        reuse_files={".reuse/dep5": dep5},
    )
    assert rows["third_party/lib.c"] == ("denied", "reuse", "GPL-2.0-only")
    assert rows["src/main.cpp"] == ("allowed", "repo-declared", "MIT")


def test_invalid_expression_in_reuse_toml_is_invalid():
    toml = REUSE_TOML.format(path="**", precedence="closest", license="MIT OR")
    rows, _ = license_gate({"a.cpp": CODE}, reuse_files={"REUSE.toml": toml})
    assert rows["a.cpp"][:2] == ("invalid", "reuse")


def test_unreadable_reuse_toml_makes_every_file_invalid_not_silently_permissive():
    rows, result = license_gate(
        {"a.cpp": CODE}, reuse_files={"REUSE.toml": "version = 1\n[[annotations]\n"}
    )
    assert rows["a.cpp"] == ("invalid", "reuse", None)
    detail = result.dropped.to_pylist()[0]["detail"]
    assert "REUSE.toml" in detail
    assert "megacpp-reuse-" not in detail and "/tmp" not in detail  # same on every run
    _, again = license_gate(
        {"a.cpp": CODE}, reuse_files={"REUSE.toml": "version = 1\n[[annotations]\n"}
    )
    assert again.dropped.to_pylist()[0]["detail"] == detail


@pytest.mark.parametrize(
    "toml",
    [
        'version = 1\n[annotations]\npath = "**"\nSPDX-License-Identifier = "MIT"\n',
        'version = 1\nannotations = ["**"]\n',
    ],
)
@pytest.mark.parametrize("where", ["REUSE.toml", "third_party/z/REUSE.toml"])
def test_a_reuse_toml_with_a_mistyped_table_makes_every_file_invalid_naming_it(toml, where):
    """`[annotations]` for `[[annotations]]` once crashed the gate (reuse raises an
    AttributeError there): it is metadata that cannot be read, like any other."""
    rows, result = license_gate(
        {"src/a.cpp": "// SPDX-License-Identifier: MIT\n" + CODE, "third_party/z/b.c": CODE},
        reuse_files={where: toml},
    )
    assert set(rows.values()) == {("invalid", "reuse", None)}
    assert all(where in row["detail"] for row in result.dropped.to_pylist())


def test_a_reuse_toml_under_subprojects_speaks_for_its_files():
    """reuse skips `subprojects/<name>/` as a Meson subproject unless asked; its files are in
    the corpus all the same, so its REUSE.toml applies as it does under third_party/."""
    toml = REUSE_TOML.format(path="**", precedence="closest", license="LicenseRef-Proprietary")
    for folder in ("subprojects", "third_party"):
        rows, _ = license_gate(
            {f"{folder}/fastlib/fast.cpp": CODE}, reuse_files={f"{folder}/fastlib/REUSE.toml": toml}
        )
        assert rows[f"{folder}/fastlib/fast.cpp"] == ("denied", "reuse", "LicenseRef-Proprietary")


@pytest.mark.parametrize(
    ("allowed", "says"),
    [
        ("GPL-2.0", "GPL-2.0"),
        ("GPL-2.0+", "GPL-2.0+"),
        ("BSD-2-Clause-FreeBSD", "BSD-2-Clause-FreeBSD"),
        ("GPL-2.0-only", "GPL-2.0-or-later"),  # as X+ passes when X does
        ("GPL-2.0-only", "GPL-2.0+"),
    ],
)
def test_an_allow_list_naming_a_deprecated_id_allows_the_files_that_say_it(allowed, says):
    policy = LicensePolicy(allowed_licenses=[allowed])
    assert decide(says, policy).decision == "allowed", (allowed, says)
    assert decide("GPL-3.0-only", policy).decision == "denied"


# Files of each real tree that carry an SPDX line: every libc++ header but three; in the
# wheels, pybind11's one LLVM-derived header (detail/function_ref.h).
SPDX_FILES = {"libcxx": 539, "pybind11": 1}


def test_real_files_with_an_spdx_line_are_decided_by_it_and_the_rest_have_no_licence():
    tree = real_cpp.debian_or_wheel("libcxx", "pybind11")
    files = {path: content.decode("utf-8") for path, content in tree.files}
    rows, result = license_gate(files, declared=None)
    with_line = {p for p, text in files.items() if "SPDX-License-Identifier:" in text}
    assert len(with_line) == SPDX_FILES[tree.key], tree.label
    for path in with_line:
        assert rows[path] == ("allowed", "file", "Apache-2.0 WITH LLVM-exception"), path
    for path in set(files) - with_line:  # no declared licence, no notice: nothing to go by
        assert rows[path] == ("unknown", "none", None), (tree.label, path)
    assert result.stats["source:file"] == len(with_line)
