"""`python -m bench` (what `make bench` runs): see bench/harness.py."""

from bench.harness import main

raise SystemExit(main())
