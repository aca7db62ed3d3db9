"""Standard licence notices: decides which SPDX expression a file's leading comment states
when it carries no tag, by the notice's defining sentences verbatim (modulo comment
decoration, case and line wrapping), never by a loose mention such as "BSD-style".
"""

from __future__ import annotations

import re

from megacpp_pipeline.gates.license.header import comment_text

_NOTICES: list[tuple[str, str, tuple[str, ...]]] = [
    # (expression, notice name, regexes that must all match the flattened lowercase comment)
    (
        "Apache-2.0 WITH LLVM-exception",
        "LLVM Project header",
        (r"part of the llvm project, under the apache license v2\.0 with llvm exceptions",),
    ),
    (
        "MIT OR NCSA",
        "LLVM dual MIT/UIUC header",
        (r"dual licensed under the mit and the university of illinois open source licenses",),
    ),
    (
        "BSL-1.0",
        "Boost Software License reference",
        (r"boost software license,? (?:- )?version 1\.0", r"license_1_0\.txt"),
    ),
    (
        "BSL-1.0",
        "Boost Software License text",
        (
            r"boost software license - version 1\.0",
            r"permission is hereby granted, free of charge, to any person or organization "
            r"obtaining a copy of the software and accompanying documentation covered by "
            r"this license",
        ),
    ),
    (
        "Apache-2.0",
        "Apache License 2.0 header",
        (
            r"licensed under the apache license,? version 2\.0",
            r"you may not use this file except in compliance with the license",
        ),
    ),
    (
        "MPL-2.0",
        "MPL 2.0 header",
        (
            r"this source code form is subject to the terms of the mozilla public license,? "
            r"v\. ?2\.0",
        ),
    ),
    (
        "MIT",
        "MIT licence text",
        (
            r"permission is hereby granted, free of charge, to any person obtaining a copy of "
            r"this software and associated documentation files",
            r"the above copyright notice and this permission notice shall be included in all "
            r"copies or substantial portions of the software",
        ),
    ),
    (
        "Zlib",
        "zlib licence text",
        (
            r"provided 'as-is', without any express or implied warranty",
            r"permission is granted to anyone to use this software for any purpose, including "
            r"commercial applications, and to alter it and redistribute it freely",
            r"the origin of this software must not be misrepresented",
        ),
    ),
    (
        "ISC",
        "ISC licence text",
        (
            r"permission to use, copy, modify, and(?:/or)? distribute this software for any "
            r"purpose with or without fee is hereby granted, provided that the above copyright "
            r"notice and this permission notice appear in all copies",
            r"provided .as is. and the authors? disclaims? all warranties",
        ),
    ),
    (
        "BSD-3-Clause",
        "BSD 3-Clause reference",
        (r"distributed under the terms of the bsd 3-clause license",),
    ),
]
_BSD_CORE = (
    r"redistribution and use in source and binary forms, with or without modification, are "
    r"permitted provided that the following conditions are met",
    r"redistributions of source code must retain the above copyright notice",
    r"redistributions in binary form must reproduce the above copyright notice",
)
_BSD_ENDORSE = r"may (?:not )?be used to endorse or promote products"
_BSD_ADVERTISING = r"all advertising materials mentioning features or use of this software"
# Decoration at a line's start (` * `, `//`, `# `), matched with the newline before it so
# that sre can jump from newline to newline instead of testing `^` at every character.
_LINE_DECOR = re.compile(r"\n[ \t]*\#?[ \t]*(?:\*+|//+|/\*+)?")
_NOTICE_WORDS = ("licen", "permission", "redistribution")  # every notice names one


def match_notice(text: str, limit: int = 8192) -> str | None:
    """The SPDX expression of a standard licence notice in the leading comment, or None.
    Conservative: the notice's defining sentences must be there verbatim (modulo comment
    decoration, case and line wrapping); a 'BSD-style licence' mention is not enough."""
    found = notices_in(comment_text(text, limit))
    if not found:
        return None
    return " AND ".join(dict.fromkeys(expression for expression, _ in found))


def notices_in(joined: str) -> list[tuple[str, str]]:
    """(expression, notice name) of every notice in the lowercase joined comments."""
    if not any(word in joined for word in _NOTICE_WORDS):
        return []
    flat = _flatten(joined)
    flat = flat.replace("\u2019", "'").replace("\u201c", '"').replace("\u201d", '"')
    # Most notices fail on their first sentence: test it before building a generator.
    found = [
        (expression, name)
        for expression, name, (first, *rest) in _NOTICE_PATTERNS
        if first.search(flat) and all(pattern.search(flat) for pattern in rest)
    ]
    if all(pattern.search(flat) for pattern in _BSD_CORE_PATTERNS):
        if re.search(_BSD_ADVERTISING, flat):
            found.append(("BSD-4-Clause", "BSD 4-Clause licence text"))
        elif re.search(_BSD_ENDORSE, flat):
            found.append(("BSD-3-Clause", "BSD 3-Clause licence text"))
        else:
            found.append(("BSD-2-Clause", "BSD 2-Clause licence text"))
    return found


def _flatten(joined: str) -> str:
    """Comment text without line decoration, every whitespace run one space (what
    `re.sub(r"\\s+", " ", ...)` gives: str.split and `\\s` share Python's whitespace)."""
    undecorated = _LINE_DECOR.sub("\n", "\n" + joined)[1:]
    words = undecorated.split()
    flat = " ".join(words)
    if undecorated[:1].isspace():
        flat = " " + flat
    if words and undecorated[-1].isspace():
        flat += " "
    return flat


_NOTICE_PATTERNS = [
    (expression, name, tuple(re.compile(p) for p in patterns))
    for expression, name, patterns in _NOTICES
]
_BSD_CORE_PATTERNS = tuple(re.compile(p) for p in _BSD_CORE)
