"""``scaleflu history status|restore``: a run's history store, its version and its heads.

``status`` prints the store's version and head, the version its server signed last (the heads
file beside the key file), its erasures, receipts and deliberate restores. ``restore`` opens a
store that is older than the signed version on purpose (a backup put back after a disk was
replaced): it needs ``--acknowledge REASON``, records the restore (in the store and in the
heads file, with the reason), continues the version above the signed one, and applies again the
erasures signed after the backup was made. See docs/testbed.md §6 ("Freshness").
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

log = logging.getLogger(__name__)


def _open(args: argparse.Namespace, acknowledge: str | None = None):  # noqa: ANN202
    from scaleflu.cli.args import trust_keys
    from scaleflu.fl.history import HistoryStore

    trust_keys(args.run, args.keys)
    if not (args.run / "history" / "history.sqlite").is_file():
        raise FileNotFoundError(args.run / "history" / "history.sqlite")
    return HistoryStore(args.run, acknowledge_rollback=acknowledge)


def _signed(args: argparse.Namespace, store_id: str | None) -> dict | None:
    from scaleflu.fl.integrity import heads_for

    heads = heads_for(args.run)
    return heads.get(store_id) if heads is not None and store_id else None


def _cmd_status(args: argparse.Namespace) -> int:
    with _open(args) as h:
        head = h.head()
        rec = _signed(args, head["store_id"]) or {}
        out = [
            f"history {args.run / 'history'}: store {head['store_id']}, version "
            f"{head['version']}, head {str(head['head'])[:16]}...",
            f"signed version (heads file): {rec.get('version', 'none recorded')}",
            f"rounds: {h.last_completed_round()}, erased clients: {sorted(h.erased_clients())}",
            f"receipts kept: {len(h.receipts())}",
        ]
        out += [
            f"restored: version {r['from_version']} over signed {r['signed_version']} "
            f"({r['reason']})"
            for r in h.restores()
        ]
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def _cmd_restore(args: argparse.Namespace) -> int:
    from scaleflu.fl.history import HistoryRollbackError

    if not args.acknowledge or not args.acknowledge.strip():
        log.error(
            "history restore: --acknowledge REASON is required: the restore is recorded with it"
        )
        return 2
    try:
        with _open(args) as h:
            head = h.head()
        sys.stdout.write(
            f"nothing to restore: history store {head['store_id']} is at version "
            f"{head['version']}, the version its server signed last\n"
        )
        return 0
    except HistoryRollbackError as exc:
        log.info("%s", exc)
    with _open(args, acknowledge=args.acknowledge) as h:
        last = h.restores()[-1]
        head = h.head()
        again = last["erasures_applied_again"]
        lines = [
            f"restored history store {head['store_id']}: version {last['from_version']} put "
            f"back over the signed version {last['signed_version']}; now version "
            f"{head['version']}, recorded with the reason {last['reason']!r}",
        ]
        lines += [f"erasure applied again: client(s) {e['clients']} ({e['reason']})" for e in again]
        if again:
            lines.append(
                "the final global model is the backup's: a request served after the backup "
                "was made must be served again (or its unlearned model put back) before the "
                "server resumes"
            )
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def add_history_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``scaleflu history``."""
    p = subparsers.add_parser(
        "history",
        help="a run's history store: version and signed heads (status), deliberate restore",
    )
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, func, text in (
        ("status", _cmd_status, "version, head, the signed version, erasures, restores"),
        ("restore", _cmd_restore, "open an older copy of the store on purpose (recorded)"),
    ):
        s = sub.add_parser(name, help=text)
        s.add_argument("--run", required=True, type=Path, help="the run folder")
        s.add_argument(
            "--keys",
            required=True,
            metavar="FILE",
            help="the server's key store or the run's integrity key file (its heads file, "
            "FILE's name with .heads.json, lies beside it)",
        )
        if name == "restore":
            s.add_argument(
                "--acknowledge",
                metavar="REASON",
                required=True,
                help="why an older copy is put back (recorded in the store and the heads file)",
            )
        s.set_defaults(func=func)
    return p
