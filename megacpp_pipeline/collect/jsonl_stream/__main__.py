"""`python -m megacpp_pipeline.collect.jsonl_stream INPUT --out DIR ...`: the converter's CLI.
Importing this module (as tests that import every module do) runs nothing."""

import sys

from megacpp_pipeline.collect.jsonl_stream.cli import main_jsonl_to_parquet

if __name__ == "__main__":
    raise SystemExit(main_jsonl_to_parquet(sys.argv[1:]))
