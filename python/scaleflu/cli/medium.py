"""``python -m scaleflu.cli.medium``: serve a shared medium (a broker) from the command line.

The broker (:class:`scaleflu.radio.medium.MediumBroker`) is the one frequency of the
``ofdm-shared`` link kind; every node's link connects to its address.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from scaleflu.radio.medium.broker import MediumBroker
from scaleflu.radio.medium.config import DEFAULT_MEDIUM_ADDRESS, MediumConfig

logger = logging.getLogger(__name__)


# -- command line: run a broker ----------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m scaleflu.cli.medium --nodes 0,1,2 [--config medium.json]``: serve a medium."""
    ap = argparse.ArgumentParser(prog="python -m scaleflu.cli.medium", description=main.__doc__)
    ap.add_argument("--nodes", default="", help="comma-separated node ids the first step waits for")
    ap.add_argument("--address", default=DEFAULT_MEDIUM_ADDRESS)
    ap.add_argument("--config", help="JSON or YAML file with MediumConfig keys")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--stats-every", type=float, default=0.0, help="log counters every N s")
    args = ap.parse_args(argv)
    d: dict[str, Any] = {}
    if args.config:
        try:
            with open(args.config, encoding="utf-8") as f:
                d = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise SystemExit(f"medium config: {exc}") from None
        if not isinstance(d, Mapping):
            raise SystemExit(f"{args.config}: a mapping of MediumConfig keys expected")
    d["address"] = args.address
    if args.nodes:
        d["nodes"] = [int(x) for x in args.nodes.split(",") if x.strip()]
    if args.seed is not None:
        d["seed"] = args.seed
    try:
        cfg = MediumConfig.from_dict(d)
    except (ValueError, TypeError) as exc:
        raise SystemExit(f"medium config: {exc}") from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        broker = MediumBroker(cfg).start()
    except Exception as exc:  # noqa: BLE001 - e.g. address in use: one line, not a traceback
        raise SystemExit(f"medium broker: {exc}") from None
    try:
        while True:
            time.sleep(args.stats_every or 3600)
            if args.stats_every:
                logger.info("medium: %s", json.dumps(broker.stats()))
    except KeyboardInterrupt:
        pass
    finally:
        broker.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
