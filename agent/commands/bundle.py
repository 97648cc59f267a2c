"""`ratchet bundle build|install`: offline install bundles for GPU hosts without a package index (sandbox/bundle.py).

On the host, where ratchet is not installed, the same install runs as
`python3 install_bundle.py install DIR` (the bundle carries a copy of sandbox/bundle.py, stdlib only).
"""

from __future__ import annotations

import argparse

from sandbox import bundle

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("bundle", help="offline install bundles (wheels, chunked) for GPU hosts without a package index")
    bundle.add_arguments(p.add_subparsers(dest="action", required=True, metavar="ACTION"))
    p.set_defaults(func=bundle.run_args)
