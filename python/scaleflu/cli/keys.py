"""``scaleflu keys enrol|rotate|revoke|list|integrity``: the testbed key store (docs/testbed.md).

The store (``--store``, default ``keys.json``) is the server's: every enrolled robot's key, the
revoked ids and the server's Ed25519 signing key. ``enrol`` and ``rotate`` write a robot's
enrolment file (its key and the server's public key only) to copy to that robot. Files are
written 0600; a store with a looser mode is refused. Keys are never printed: ``list`` shows
fingerprints. ``integrity --store FILE`` writes a fresh integrity key file (0600, never
overwritten) for ``scaleflu train/unlearn --keys FILE`` outside the testbed (whose server derives
its integrity key from its signing key).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

log = logging.getLogger(__name__)


def _robots(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"robot ids {text!r}: expected e.g. 3 or 1,2,3") from None
    if not ids or any(not 1 <= r <= 0xFFFE for r in ids):
        raise argparse.ArgumentTypeError(f"robot ids {text!r}: each in 1..65534")
    return ids


def _cmd_keys(args: argparse.Namespace) -> int:
    from scaleflu.testbed.keys import KeyStore

    store_path = Path(args.store)
    if args.action == "integrity":
        from scaleflu.keys import fingerprint, load_integrity_key, write_integrity_key

        if store_path.exists():
            log.error("keys integrity: %s exists; not overwriting a key", store_path)
            return 2
        write_integrity_key(store_path)
        print(f"wrote {store_path}: integrity key {fingerprint(load_integrity_key(store_path))}")  # noqa: T201
        return 0
    try:
        if args.action == "enrol" and not store_path.exists():
            store = KeyStore.create([])
            log.info("new key store %s (a new server signing identity)", store_path)
        else:  # a weak key is read here so that `rotate` can replace it (`list` flags it)
            store = KeyStore.load(store_path, allow_weak=True)
        out_dir = Path(args.out_dir)
        written = []
        for r in args.robot or []:
            if args.action == "enrol":
                store.enrol(r)
            elif args.action == "rotate":
                store.rotate(r)
            elif args.action == "revoke":
                store.revoke(r)
            if args.action in ("enrol", "rotate"):
                written.append(store.write_enrolment(r, out_dir / f"robot{r}.json"))
        if args.action != "list":
            store.save(store_path)
    except (OSError, ValueError, KeyError) as exc:
        log.error("keys %s: %s", args.action, exc)
        return 2
    for line in store.describe():
        print(line)  # noqa: T201 - the command's output
    for p in written:
        print(f"wrote {p} (copy it to that robot only)")  # noqa: T201
    return 0


def add_keys_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``scaleflu keys``."""
    p = subparsers.add_parser(
        "keys", help="enrol, rotate, revoke or list testbed robot keys; integrity key files"
    )
    p.add_argument("action", choices=["enrol", "rotate", "revoke", "list", "integrity"])
    p.add_argument("--store", default="keys.json", help="the server's key store (0600)")
    p.add_argument("--robot", type=_robots, help="robot id(s), e.g. 3 or 1,2,3")
    p.add_argument("--out-dir", default=".", help="where enrolment files robotN.json go")
    p.set_defaults(func=_cmd_keys)
    return p
