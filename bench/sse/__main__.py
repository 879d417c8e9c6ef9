"""`python -m bench.sse.client`'s entry: see bench/sse/client.py."""

from __future__ import annotations

import sys

from bench.sse.client import main

if __name__ == "__main__":
    sys.exit(main())
