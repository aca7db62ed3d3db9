"""The Dagster shell, generated from the stage registry (factory.py): assets, blocking
checks, the nightly refresh (schedules.py), `build_defs` (defs.py) and `megacpp run`
(runner.py)."""

import warnings

import dagster as dg

# Partitioned asset checks (preview), single-run backfill policies and the automation
# sensor's default condition (beta) are used knowingly in 1.13; keep their warnings out of
# every run's output.
warnings.filterwarnings("ignore", category=dg.PreviewWarning)
warnings.filterwarnings("ignore", category=dg.BetaWarning)
