"""`python -m megacpp_pipeline.collect.jsonl_stream INPUT --out DIR ...`: the converter's CLI."""

import sys

from megacpp_pipeline.collect.jsonl_stream.cli import main_jsonl_to_parquet

raise SystemExit(main_jsonl_to_parquet(sys.argv[1:]))
