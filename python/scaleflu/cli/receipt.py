"""``scaleflu receipt verify FILE``: check an erasure receipt offline (docs/testbed.md §6).

The server's public key comes from ``--key FILE`` (a robot's enrolment file, the server's key
store, or the integrity key file of a simulation run) or ``--public-key HEX``; ``--model FILE``
(a safetensors model) or ``--model-sha256 HEX`` checks that the receipt is about that model.
Prints what the receipt proves and what it does not. Exit status 0: valid; 1: not valid (one
line); 2: the receipt or key cannot be read. Needs no torch and no run folder.
"""

from __future__ import annotations

import argparse
import logging
import sys

log = logging.getLogger(__name__)


def _cmd_verify(args: argparse.Namespace) -> int:
    from scaleflu.unlearn.receipt import (
        ReceiptError,
        explain,
        model_file_sha256,
        read_receipt,
        verify_receipt,
    )

    if args.public_key:
        try:
            public = bytes.fromhex(args.public_key)
        except ValueError:
            public = b""
        if len(public) != 32:
            log.error("--public-key: expected 64 hex digits (a raw Ed25519 public key)")
            return 2
    elif args.key:
        from scaleflu.keys import receipt_public_key

        public = receipt_public_key(args.key)
    else:
        log.error(
            "give the server's public key (--key FILE or --public-key HEX): a receipt checked "
            "against the key it carries itself proves nothing"
        )
        return 2
    sha = args.model_sha256
    if args.model:
        sha = model_file_sha256(args.model)
    try:
        receipt = read_receipt(args.file)
        verified = verify_receipt(receipt, public, sha, source=str(args.file))
    except ReceiptError as exc:
        log.error("%s", exc)
        return 1
    lines = explain(verified)
    if sha is not None:
        lines.insert(1, f"the model given ({sha[:16]}...) is the model it names as the new one")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def add_receipt_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``scaleflu receipt``."""
    p = subparsers.add_parser(
        "receipt",
        help="check an erasure receipt offline (what it proves and what it does not)",
        description="Check an erasure receipt signed by an edge server or by `scaleflu unlearn "
        "--erase --keys`: its Ed25519 signature under the server's public key and, with "
        "--model, that it is about that model.",
    )
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    v = sub.add_parser("verify", help="verify a receipt file")
    v.add_argument("file", metavar="FILE", help="the receipt (JSON)")
    who = v.add_mutually_exclusive_group()
    who.add_argument(
        "--key",
        metavar="FILE",
        help="a robot's enrolment file, the server's key store, or a run's integrity key file",
    )
    who.add_argument("--public-key", metavar="HEX", help="the server's raw Ed25519 public key")
    what = v.add_mutually_exclusive_group()
    what.add_argument("--model", metavar="FILE", help="the model you hold (safetensors)")
    what.add_argument("--model-sha256", metavar="HEX", help="its SHA-256 (state digest)")
    v.set_defaults(func=_cmd_verify)
    return p
