"""Training history for unlearning: per-round participants, data sizes, updates, global models.

Rounds are numbered as in the paper, ``t = 1..T``. ``global_model(t)`` is Theta[t], the model
*broadcast at the start* of round t (``global_model(1)`` is the initial model and
``global_model(T + 1) == final_model()`` the model after the last round). The update of client
n in round t is ``Theta_{n,E}[t] - Theta[t]`` over every floating-point state-dict entry
(parameters and float buffers such as BatchNorm running statistics; integer buffers are left
out), so its local model is ``global_model(t) + client_update(t, n)``.

AoI bookkeeping (docs/scale.md, "AoI"): every sensitivity layer l is cut into groups j
(:func:`scaleflu.fl.models.parameter_groups`). A group counts as updated in round t when
``max |Theta[t+1] - Theta[t]|`` over its entries exceeds the tolerance; its last-update time is
then round t and, in seconds, the simulated link clock when the broadcast of Theta[t+1]
finished. The link model is ``bytes / goodput + latency`` per transfer. Round 0 is the
broadcast of the initial model Theta[1]; round t >= 1 costs one upload of the model per
participant (when ``count_uplink``) plus one broadcast of Theta[t+1]. The per-group maximum
changes are kept per round, so the tolerance can be changed after the fact.

On disk (``run_dir/history``): ``history.sqlite`` holds the metadata; tensors are safetensors
files, ``global_{t:05d}`` (always float32, always kept) and ``updates_{t:05d}`` (keys
``"<client>/<name>"``, float16 when ``fp16``; only the last ``keep_rounds`` rounds are kept
when that is set). Table ``files`` maps each of these names to its file and the file's SHA-256:
a file is written first (``global_00003.safetensors``; a rewrite under a new name,
``updates_00002-v17.safetensors``), then committed to SQLite with the change it belongs to, and
the file it replaces is removed after the commit. Files no committed row names (a crash
mid-round or mid-erasure) are removed when the store is opened, so a crash leaves the store as
it was after its last committed change.

Version and head: every committed change increments the store's ``version`` (in ``meta``);
with an integrity key the metadata digest (over every table, the files' SHA-256 included) is
the store's **head** at that version. With the run's :class:`~scaleflu.fl.integrity.HistoryHeads`
registered (the server's, beside its key store), each commit records (version, head) there and
opening a store whose version is below the recorded one, or equal with another head, raises
:class:`~scaleflu.fl.integrity.RollbackError`: a copy of the store put back after a later
change (an erasure, say) is refused. ``acknowledge_rollback`` (``scaleflu history restore``)
opens such a copy on purpose: the restore is recorded, the version continues above the signed
one, and the erasures signed after the copy was made are applied again.

Erasure (:meth:`HistoryStore.erase_clients`, after an unlearning request is served): a
forgotten client's stored updates are deleted from every round's updates file (the file is
rewritten without them and replaced atomically), the client leaves those rounds' participants
and data sizes, and table ``erased`` records each (round, client, data size, bytes, reason).
:meth:`HistoryStore.replace_final` overwrites the final global model with the unlearned one,
so a restarted server resumes from it. The intermediate global models Theta[t] and the other
clients' later updates were computed after the client's updates had been averaged in; they are
kept (SCALE and the baselines of later requests need them) and the erasure summary lists them
as ``derived_kept_rounds``. One erasure is one commit (all its rounds at once), and its summary
names the SHA-256 of every stored update it deleted (what an erasure receipt signs). Receipts
are kept in table ``receipts`` (:meth:`HistoryStore.append_receipt`), inside the digest: the
store's integrity chain holds every receipt its server issued.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import hmac
import json
import logging
import math
import secrets
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save_file

from scaleflu.fl.integrity import (
    CorruptFileError,
    HistoryHeads,
    IntegrityError,
    RollbackError,
    check_mac,
    heads_for,
    key_for,
    load_tensors,
    state_sha256,
)
from scaleflu.link.mcs import expected_frame_airtime_s, mcs_name

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (
    round INTEGER PRIMARY KEY,
    participants TEXT NOT NULL,
    data_sizes TEXT NOT NULL,
    metrics TEXT NOT NULL,
    wall_s REAL NOT NULL,
    link_s REAL NOT NULL,
    cum_link_s REAL NOT NULL,
    bytes INTEGER NOT NULL,
    updates_kept INTEGER NOT NULL,
    recorded_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS erased (
    round INTEGER NOT NULL,
    client INTEGER NOT NULL,
    data_size INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    reason TEXT NOT NULL,
    erased_at REAL NOT NULL,
    PRIMARY KEY (round, client)
);
CREATE TABLE IF NOT EXISTS group_change (
    round INTEGER NOT NULL,
    layer TEXT NOT NULL,
    grp INTEGER NOT NULL,
    max_abs REAL NOT NULL,
    PRIMARY KEY (round, layer, grp)
);
CREATE TABLE IF NOT EXISTS integrity (
    id INTEGER PRIMARY KEY CHECK (id IN (1, 2)),
    mac TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS files (
    name TEXT PRIMARY KEY,
    path TEXT NOT NULL,
    sha256 TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS receipts (
    seq INTEGER PRIMARY KEY,
    version INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    body TEXT NOT NULL
);
"""
# Tables covered by the metadata digest (row 1 of ``integrity``), each with its ordering. The
# append-only group_change table (rounds x groups rows) is covered by a chain instead (row 2):
# chain_t = HMAC(chain_{t-1}, round t's rows), extended when a round is recorded and recomputed
# once when the store is opened, so a write costs O(rounds), not O(rounds x groups).
_DIGEST_TABLES = (
    ("meta", "key"),
    ("rounds", "round"),
    ("erased", "round, client"),
)
# schema 2 adds the tensor files' SHA-256 and the erasure receipts to the digest
_DIGEST_TABLES_V2 = (*_DIGEST_TABLES, ("files", "name"), ("receipts", "seq"))


@dataclass(frozen=True)
class LinkModel:
    """Simulated link: a transfer of ``b`` bytes takes ``b / goodput + latency`` seconds.

    ``phy`` "stock" (the paper's): ``goodput`` as given. Otherwise the OFDM PHY's airtime from
    the MCS table (``scaleflu.link.mcs``): ``phy`` "adaptive" (each frame at the MCS link
    adaptation picks for its SNR) or an MCS name; the bytes go in link frames of ``mtu``, each
    taking its expected airtime at mean SNR ``snr_db`` over ``fading`` ("none" or Rician K =
    6 dB as the testbed's channel) with the measured frame error rates
    (``expected_frame_airtime_s``; ``goodput`` is not used).
    """

    goodput: float = 5.7e6 / 8  # bytes per second (about 5.7 Mbit/s, the stock OFDM PHY)
    latency: float = 0.01  # seconds per transfer
    count_uplink: bool = True  # charge each participant's upload to the round
    phy: str = "stock"  # stock | adaptive | an MCS name
    snr_db: float = 20.0  # mean SNR of the modelled PHY (phy other than stock)
    fading: str = "none"  # none | rician | rayleigh (phy other than stock)
    mtu: int = 1500

    def __post_init__(self) -> None:
        if self.phy != "stock":
            object.__setattr__(self, "phy", mcs_name(self.phy))
            if self.phy != "stock":
                self._frame_s(self.mtu)  # a bad fading or an SNR nothing gets through: now

    def _frame_s(self, frame_bytes: int) -> float:
        s = _expected_frame_s(self.phy, frame_bytes, self.snr_db, self.fading)
        if not math.isfinite(s):
            raise ValueError(
                f"link model: no frame gets through at {self.snr_db} dB with PHY {self.phy}"
            )
        return s

    def seconds(self, nbytes: int) -> float:
        """Seconds to move ``nbytes`` over the link."""
        if self.phy == "stock":
            return nbytes / self.goodput + self.latency
        per = self.mtu - 26  # link frame overhead (header 22 B + CRC32)
        full, last = divmod(max(0, int(nbytes)), per)
        s = full * self._frame_s(self.mtu) + (self._frame_s(last + 26) if last else 0.0)
        return s + self.latency


@functools.lru_cache(maxsize=256)
def _expected_frame_s(phy: str, frame_bytes: int, snr_db: float, fading: str) -> float:
    return expected_frame_airtime_s(phy, frame_bytes, snr_db, fading)


def float_entries(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The floating-point entries of a state dict (what updates and aggregation cover)."""
    return {k: v for k, v in state.items() if torch.is_floating_point(v)}


def state_bytes(state: Mapping[str, torch.Tensor]) -> int:
    """Bytes of a state dict's float entries sent as float32 (the broadcast size)."""
    return sum(v.numel() * 4 for v in float_entries(state).values())


class DivergedError(RuntimeError):
    """Training produced a non-finite global model; the round is not recorded."""


class HistoryIntegrityError(IntegrityError):
    """The store's SQLite metadata or a tensor file fails its authenticated digest."""


class HistoryRollbackError(HistoryIntegrityError, RollbackError):
    """The store is older than the last version its server signed (see the module docstring)."""


def _when(t: float | None) -> str:
    if t is None:
        return "at an unknown time"
    return datetime.datetime.fromtimestamp(float(t), datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


class HistoryStore:
    """SQLite + safetensors record of a FedAvg run (see the module docstring for the layout)."""

    def __init__(
        self,
        run_dir: str | Path,
        keep_rounds: int | None = None,
        fp16: bool = False,
        groups: Mapping[str, list[tuple[int, int]]] | None = None,
        link: LinkModel | None = None,
        update_tol: float = 0.0,
        integrity_key: bytes | None = None,
        heads: HistoryHeads | None = None,
        acknowledge_rollback: str | None = None,
    ) -> None:
        """Open (or create) the store under ``run_dir/history``; settings persist in SQLite.

        ``integrity_key`` (default: the key :func:`scaleflu.fl.integrity.trust` registered for
        ``run_dir``): the SQLite metadata carries an HMAC-SHA256 digest under it (over the
        tensor files' SHA-256 too), written with every change and checked on open (the
        metadata) and on every load (the tensor files); a store that fails is refused with
        HistoryIntegrityError. None: no digest is written or checked.

        ``heads`` (default: the one registered with the key): the sealed record of the last
        version its server signed; an older store is refused with HistoryRollbackError unless
        ``acknowledge_rollback`` gives the operator's reason for restoring it on purpose.
        """
        if keep_rounds is not None and keep_rounds < 1:
            raise ValueError(f"keep_rounds must be >= 1 or None, got {keep_rounds}")
        self.dir = Path(run_dir) / "history"
        self._key: bytes | None = None
        self._heads: HistoryHeads | None = None
        # files written but not committed yet: name -> (file, sha256), or None (deleted)
        self._pending: dict[str, tuple[str, str] | None] = {}
        self.dir.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.dir / "history.sqlite")
        try:
            self._db.executescript(_SCHEMA)
            key = integrity_key if integrity_key is not None else key_for(run_dir)
            if key is not None:
                self.integrity_key = key  # checks the metadata before anything is read
                self._heads = heads if heads is not None else heads_for(run_dir)
            meta = self._meta()
            if "schema" not in meta:
                self._set_meta(
                    schema=SCHEMA_VERSION,
                    store_id=secrets.token_hex(8),
                    keep_rounds=keep_rounds,
                    fp16=fp16,
                    groups={k: [list(g) for g in v] for k, v in (groups or {}).items()},
                    layers=list((groups or {}).keys()),
                    link=vars(link or LinkModel()),
                    update_tol=update_tol,
                    initial_link_s=None,
                )
                meta = self._meta()
            else:
                if int(meta["schema"]) < 2:
                    self._migrate()
                self._check_fresh(acknowledge_rollback)
                meta = self._meta()
                if groups is not None and list(groups) != meta["layers"]:
                    raise ValueError("history store was created with different layers/groups")
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise CorruptFileError(
                f"{self.dir / 'history.sqlite'}: the history database is unreadable ({exc})"
            ) from None
        except Exception:
            self._db.close()
            raise
        self.keep_rounds: int | None = meta["keep_rounds"]
        self.fp16: bool = bool(meta["fp16"])
        self.layers: list[str] = list(meta["layers"])
        self.groups: dict[str, list[tuple[int, int]]] = {
            k: [(int(a), int(b)) for a, b in v] for k, v in meta["groups"].items()
        }
        self.link = LinkModel(**meta["link"])
        self.update_tol = float(meta["update_tol"])
        self._cleanup_uncommitted()

    # -- integrity -------------------------------------------------------------------------

    @property
    def integrity_key(self) -> bytes | None:
        """HMAC key of the store's digests (None: none written or checked)."""
        return self._key

    @integrity_key.setter
    def integrity_key(self, key: bytes | None) -> None:
        """Set the key: the SQLite metadata is checked at once (a fresh store gets a digest)."""
        if key is None:
            self._key = None
            return
        key = bytes(key)
        row = self._db.execute("SELECT mac FROM integrity WHERE id = 1").fetchone()
        if row is None:
            if self._has_content():
                raise HistoryIntegrityError(
                    f"{self.dir / 'history.sqlite'}: the history metadata has no authenticated "
                    "digest (written without a key, or the digest was removed); refusing it"
                )
            self._key = key
            with self._tx():
                pass
            return
        if not hmac.compare_digest(str(row[0]), self._db_mac(key)) or not hmac.compare_digest(
            self._stored_chain(), self._full_chain(key)
        ):
            raise HistoryIntegrityError(
                f"{self.dir / 'history.sqlite'}: the history metadata (rounds, participants, "
                "data sizes, erasures) fails its authenticated digest (modified, or written "
                "under another key); refusing it"
            )
        self._key = key

    def _has_content(self) -> bool:
        """Whether the store records anything beyond its settings (rounds, initial model)."""
        (n,) = self._db.execute("SELECT COUNT(*) FROM rounds").fetchone()
        (e,) = self._db.execute("SELECT COUNT(*) FROM erased").fetchone()
        return bool(n or e or any(self.dir.glob("global_*.safetensors")))

    def _schema(self) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        return int(json.loads(row[0])) if row is not None else SCHEMA_VERSION

    def _db_mac(self, key: bytes) -> str:
        """HMAC-SHA256 of every row of the metadata tables and the group_change chain (hex)."""
        h = hmac.new(key, b"scaleflu-history-sqlite\0", hashlib.sha256)
        tables = _DIGEST_TABLES if self._schema() < 2 else _DIGEST_TABLES_V2
        for table, order in tables:
            h.update(f"{table}\0".encode())
            for row in self._db.execute(f"SELECT * FROM {table} ORDER BY {order}"):
                h.update(json.dumps(list(row), separators=(",", ":")).encode() + b"\n")
        h.update(b"group_change\0" + self._stored_chain().encode())
        return h.hexdigest()

    def _stored_chain(self) -> str:
        row = self._db.execute("SELECT mac FROM integrity WHERE id = 2").fetchone()
        return "" if row is None else str(row[0])

    def _chain_step(self, key: bytes, prev: str, t: int) -> str:
        h = hmac.new(key, f"group_change\0{prev}\0{int(t)}\0".encode(), hashlib.sha256)
        rows = self._db.execute(
            "SELECT * FROM group_change WHERE round = ? ORDER BY layer, grp", (int(t),)
        )
        for row in rows:
            h.update(json.dumps(list(row), separators=(",", ":")).encode() + b"\n")
        return h.hexdigest()

    def _full_chain(self, key: bytes) -> str:
        chain = ""
        for (t,) in self._db.execute("SELECT DISTINCT round FROM group_change ORDER BY round"):
            chain = self._chain_step(key, chain, t)
        return chain

    def _extend_chain(self, t: int) -> None:
        """Inside a transaction: round t's group_change rows were inserted; extend the chain."""
        if self._key is not None:
            chain = self._chain_step(self._key, self._stored_chain(), t)
            self._db.execute("INSERT OR REPLACE INTO integrity (id, mac) VALUES (2, ?)", (chain,))

    @contextmanager
    def _tx(
        self,
        erasure: Mapping[str, Any] | None = None,
        restore: Mapping[str, Any] | None = None,
    ) -> Iterator[sqlite3.Connection]:
        """One transaction: the change, the files written for it, the next version and the
        metadata digest, atomically; then the replaced files go and the heads file records the
        new version (``erasure``/``restore``: what it records beside it)."""
        head = None
        try:
            with self._db:
                yield self._db
                gone = self._flush_files()
                version = self.version + 1
                self._db.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('version', ?)",
                    (json.dumps(version),),
                )
                if self._key is not None:
                    head = self._db_mac(self._key)
                    self._db.execute(
                        "INSERT OR REPLACE INTO integrity (id, mac) VALUES (1, ?)", (head,)
                    )
        except BaseException:
            for got in self._pending.values():  # files of a change that was not committed
                if got is not None and not self._committed(got[0]):
                    (self.dir / got[0]).unlink(missing_ok=True)
            self._pending.clear()
            raise
        for path in gone:
            path.unlink(missing_ok=True)
        store_id = self._meta_value("store_id")
        if self._heads is not None and head is not None and store_id is not None:
            self._heads.advance(store_id, version, head, str(self.dir), erasure, restore)

    # -- version, head, freshness ------------------------------------------------------------

    def _meta_value(self, key: str, default: Any = None) -> Any:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row is not None else default

    @property
    def version(self) -> int:
        """The store's version: the number of changes committed to it (grows, never falls)."""
        return int(self._meta_value("version", 0))

    @property
    def store_id(self) -> str | None:
        """The store's random id (the heads file's key for it)."""
        return self._meta_value("store_id")

    def head(self) -> dict[str, Any]:
        """``{"store_id", "version", "head"}``: the store as of now (head: the metadata digest
        under the integrity key; None without a key)."""
        row = self._db.execute("SELECT mac FROM integrity WHERE id = 1").fetchone()
        head = str(row[0]) if row is not None and self._key is not None else None
        return {"store_id": self.store_id, "version": self.version, "head": head}

    def _check_fresh(self, acknowledge: str | None) -> None:
        """Refuse a store older than (or forked from) the version its heads file records."""
        store_id = self.store_id
        if self._heads is None or store_id is None:
            return
        mine = self.head()
        rec = self._heads.get(store_id)
        if rec is None or mine["version"] > int(rec["version"]):
            if rec is not None:  # a crash between the commit and the heads file: catch up
                log.info(
                    "history %s: version %d is ahead of the recorded %d; recorded now",
                    self.dir,
                    mine["version"],
                    rec["version"],
                )
            self._heads.advance(store_id, mine["version"], mine["head"], str(self.dir))
            return
        signed = int(rec["version"])
        if mine["version"] == signed and hmac.compare_digest(str(mine["head"]), str(rec["head"])):
            return
        if acknowledge is not None:
            self._restore(rec, acknowledge)
            return
        lost = [e for e in rec.get("erasures", []) if int(e["version"]) > mine["version"]]
        what = (
            "a different store with the same version (a fork)"
            if mine["version"] == signed
            else "an older copy of the store, put back after later changes"
        )
        if lost:
            clients = sorted({int(n) for e in lost for n in e.get("clients", [])})
            what += f" (it predates the erasure of client(s) {clients})"
        raise HistoryRollbackError(
            f"{self.dir / 'history.sqlite'}: history store {store_id} is at version "
            f"{mine['version']}, its server signed version {signed} {_when(rec.get('updated_at'))}"
            f": {what}; refusing it (to restore a backup on purpose: scaleflu history restore "
            f"--run {self.dir.parent} --keys KEY_FILE --acknowledge REASON)"
        )

    def _restore(self, rec: Mapping[str, Any], reason: str) -> None:
        """Open an older copy on purpose: recorded, the version continues above the signed
        one, and the erasures signed after the copy was made are applied again."""
        if not str(reason).strip():
            raise ValueError("a restore needs a reason (--acknowledge REASON)")
        mine = self.version
        signed = int(rec["version"])
        lost = [e for e in rec.get("erasures", []) if int(e["version"]) > mine]
        entry = {
            "at": time.time(),
            "from_version": mine,
            "signed_version": signed,
            "reason": str(reason),
            "erasures_applied_again": [
                {"clients": e.get("clients", []), "reason": e.get("reason", "")} for e in lost
            ],
        }
        restores = list(self._meta_value("restores", []))
        with self._tx(restore=entry):  # version := signed + 1
            self._db.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('version', ?)",
                (json.dumps(signed),),
            )
            self._db.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('restores', ?)",
                (json.dumps([*restores, entry]),),
            )
        log.warning(
            "history %s: restored version %d over the signed version %d (%s); recorded",
            self.dir,
            mine,
            signed,
            reason,
        )
        for e in lost:
            got = self.erase_clients(
                [int(n) for n in e.get("clients", [])],
                reason=f"applied again after a restore: {e.get('reason', '')}",
            )
            log.warning(
                "history %s: erasure of client(s) %s (%s) applied again: %d stored updates",
                self.dir,
                got["clients"],
                e.get("reason", ""),
                got["updates"],
            )

    def restores(self) -> list[dict[str, Any]]:
        """Deliberate restores of older copies (``scaleflu history restore``), oldest first."""
        return list(self._meta_value("restores", []))

    # -- low level -------------------------------------------------------------------------

    def _meta(self) -> dict[str, Any]:
        rows = self._db.execute("SELECT key, value FROM meta").fetchall()
        return {k: json.loads(v) for k, v in rows}

    def _set_meta(self, **items: Any) -> None:
        with self._tx():
            self._db.executemany(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                [(k, json.dumps(v)) for k, v in items.items()],
            )

    def _file_row(self, name: str) -> tuple[str, str] | None:
        row = self._db.execute("SELECT path, sha256 FROM files WHERE name = ?", (name,)).fetchone()
        return (str(row[0]), str(row[1])) if row is not None else None

    def _committed(self, filename: str) -> bool:
        q = "SELECT 1 FROM files WHERE path = ?"
        return self._db.execute(q, (filename,)).fetchone() is not None

    def _path(self, name: str) -> Path:
        """The file of tensor file ``name`` as committed (its first name when none is)."""
        row = self._file_row(name)
        return self.dir / (row[0] if row is not None else f"{name}.safetensors")

    def _global_path(self, t: int) -> Path:
        return self._path(f"global_{t:05d}")

    def _updates_path(self, t: int) -> Path:
        return self._path(f"updates_{t:05d}")

    def _save(self, tensors: Mapping[str, torch.Tensor], name: str) -> None:
        """Write tensor file ``name``; it counts once the next transaction commits it."""
        got = self._pending.get(name)
        if got is not None:
            filename = got[0]
        elif self._file_row(name) is None:
            filename = f"{name}.safetensors"
        else:  # a rewrite goes to a new file: the committed one stays until the commit
            filename = f"{name}-v{self.version + 1}.safetensors"
        path = self.dir / filename
        tmp = path.with_name(filename + ".tmp")
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp))
        sha = hashlib.sha256(tmp.read_bytes()).hexdigest()
        tmp.replace(path)
        self._pending[name] = (filename, sha)

    def _delete(self, name: str) -> None:
        """Delete tensor file ``name`` when the next transaction commits."""
        self._pending[name] = None

    def _flush_files(self) -> list[Path]:
        """Inside a transaction: commit the pending files; the files they replace (to remove)."""
        gone: list[Path] = []
        for name, got in self._pending.items():
            old = self._file_row(name)
            if got is None:
                self._db.execute("DELETE FROM files WHERE name = ?", (name,))
            else:
                self._db.execute(
                    "INSERT OR REPLACE INTO files (name, path, sha256) VALUES (?, ?, ?)",
                    (name, got[0], got[1]),
                )
            if old is not None and (got is None or old[0] != got[0]):
                gone.append(self.dir / old[0])
        self._pending.clear()
        return gone

    def _load(self, name: str, prefix: str | None = None) -> dict[str, torch.Tensor]:
        path = self._path(name)
        if not path.is_file():
            raise HistoryIntegrityError(f"{path}: a history file the store records is missing")
        if self._key is None:
            return load_tensors(path, "history file", prefix)
        # its SHA-256 is in the authenticated metadata
        row = self._file_row(name)
        data = path.read_bytes()
        if row is None or not hmac.compare_digest(hashlib.sha256(data).hexdigest(), row[1]):
            raise HistoryIntegrityError(
                f"{path}: history file fails its authenticated digest (modified, put back "
                "from an older copy, or written under another key); refusing it"
            )
        try:
            flat = load_safetensors(data)
        except (SafetensorError, ValueError, RuntimeError) as exc:
            raise CorruptFileError(
                f"{path}: history file is not a readable safetensors file ({exc})"
            ) from None
        if prefix is None:
            return flat
        return {k[len(prefix) :]: v for k, v in flat.items() if k.startswith(prefix)}

    def _migrate(self) -> None:
        """A store of schema 1 (tensor files with ``.mac`` sidecars) becomes schema 2: its
        committed files are recorded with their SHA-256 (each checked against its sidecar
        under the key first), a store id and a version are set."""
        self._cleanup_v1()
        rows = []
        for path in sorted(self.dir.glob("*.safetensors")):
            if self._key is not None:
                try:
                    check_mac(self._key, path, "history file")
                except IntegrityError as exc:
                    raise HistoryIntegrityError(str(exc)) from None
            rows.append((path.stem, path.name, hashlib.sha256(path.read_bytes()).hexdigest()))
        with self._tx():
            self._db.executemany("INSERT OR REPLACE INTO files VALUES (?, ?, ?)", rows)
            self._db.executemany(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                [
                    ("schema", json.dumps(SCHEMA_VERSION)),
                    ("store_id", json.dumps(secrets.token_hex(8))),
                ],
            )
        for path in self.dir.glob("*.safetensors.mac"):
            path.unlink()
        log.info(
            "history %s: upgraded to schema %d (%d files)", self.dir, SCHEMA_VERSION, len(rows)
        )

    def _cleanup_v1(self) -> None:
        """Schema 1: files of rounds past the last committed one are uncommitted."""
        last = self.last_completed_round()
        has_initial = self._meta().get("initial_link_s") is not None
        for path in self.dir.glob("global_*.safetensors"):
            t = int(path.stem.split("_")[1])
            if t > last + 1 or (t == 1 and not has_initial and last == 0):
                path.unlink()
        for path in self.dir.glob("updates_*.safetensors"):
            if int(path.stem.split("_")[1]) > last:
                path.unlink()

    def _cleanup_uncommitted(self) -> None:
        """Remove temporary files and tensor files no committed row names."""
        committed = {str(p) for (p,) in self._db.execute("SELECT path FROM files")}
        for path in list(self.dir.glob("*.tmp")):
            path.unlink()
        for path in list(self.dir.glob("*.safetensors")):
            if path.name not in committed:
                path.unlink()

    def close(self) -> None:
        """Close the SQLite connection."""
        self._db.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing ---------------------------------------------------------------------------

    def record_initial(self, global_state: Mapping[str, torch.Tensor]) -> None:
        """Store the initial model Theta[1] and charge its broadcast (round 0) to the link."""
        self._save(
            {k: v.float() if v.is_floating_point() else v for k, v in global_state.items()},
            "global_00001",
        )
        self._set_meta(initial_link_s=self.link.seconds(state_bytes(global_state)))

    def record_round(
        self,
        t: int,
        participants: Iterable[int],
        data_sizes: Mapping[int, int],
        client_states: Mapping[int, Mapping[str, torch.Tensor]],
        new_global: Mapping[str, torch.Tensor],
        metrics: Mapping[str, Any] | None = None,
        wall_s: float = 0.0,
    ) -> dict[str, float]:
        """Record round t: local models Theta_{n,E}[t] (stored as updates) and Theta[t+1].

        Returns the round's link accounting ``{"link_s", "cum_link_s", "bytes"}``.
        """
        last = self.last_completed_round()
        if t != last + 1:
            raise ValueError(f"round {t} recorded out of order (last completed is {last})")
        if self._meta().get("initial_link_s") is None:
            raise RuntimeError("record_initial() must be called before the first round")
        participants = [int(n) for n in participants]
        start = self.global_model(t)
        updates: dict[str, torch.Tensor] = {}
        dtype = torch.float16 if self.fp16 else torch.float32
        for n in participants:
            local = float_entries(client_states[n])
            for k, v in local.items():
                updates[f"{n}/{k}"] = (v.detach().float() - start[k]).to(dtype)
        new_global = {
            k: v.detach().float() if v.is_floating_point() else v.detach()
            for k, v in new_global.items()
        }
        bad = [k for k, v in new_global.items() if v.is_floating_point() and not v.isfinite().all()]
        if bad:
            raise DivergedError(
                f"round {t}: training diverged, the new global model has NaN/Inf in "
                f"{', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}; the round is not recorded "
                "(lower fl.lr or fl.momentum and start a new run)"
            )
        changes = []
        for layer, groups in self.groups.items():
            delta = (new_global[layer] - start[layer]).abs().flatten()
            for j, (a, b) in enumerate(groups):
                changes.append((t, layer, j, float(delta[a:b].max())))
        model_bytes = state_bytes(new_global)
        link_s = self.link.seconds(model_bytes)
        nbytes = model_bytes
        if self.link.count_uplink:
            link_s += len(participants) * self.link.seconds(model_bytes)
            nbytes += len(participants) * model_bytes
        cum = self.cumulative_link_seconds(last) + link_s
        if updates:
            self._save(updates, f"updates_{t:05d}")
        self._save(new_global, f"global_{t + 1:05d}")
        with self._tx():
            self._db.execute(
                "INSERT INTO rounds VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    t,
                    json.dumps(participants),
                    json.dumps({str(n): int(data_sizes[n]) for n in participants}),
                    json.dumps(dict(metrics or {})),
                    float(wall_s),
                    link_s,
                    cum,
                    nbytes,
                    1 if updates else 0,
                    time.time(),
                ),
            )
            self._db.executemany("INSERT INTO group_change VALUES (?, ?, ?, ?)", changes)
            if changes:
                self._extend_chain(t)
        self._apply_retention(t)
        return {"link_s": link_s, "cum_link_s": cum, "bytes": float(nbytes)}

    def _apply_retention(self, t: int) -> None:
        if self.keep_rounds is None:
            return
        old = [
            r
            for (r,) in self._db.execute(
                "SELECT round FROM rounds WHERE updates_kept = 1 AND round <= ?",
                (t - self.keep_rounds,),
            )
        ]
        for r in old:
            self._delete(f"updates_{r:05d}")
        if old:
            with self._tx():
                self._db.executemany(
                    "UPDATE rounds SET updates_kept = 0 WHERE round = ?", [(r,) for r in old]
                )

    # -- reading ---------------------------------------------------------------------------

    def rounds(self) -> list[int]:
        """Completed rounds, ascending."""
        return [r for (r,) in self._db.execute("SELECT round FROM rounds ORDER BY round")]

    def last_completed_round(self) -> int:
        """The last completed round (0 when none)."""
        (r,) = self._db.execute("SELECT COALESCE(MAX(round), 0) FROM rounds").fetchone()
        return int(r)

    def _row(self, t: int, cols: str) -> tuple[Any, ...]:
        row = self._db.execute(f"SELECT {cols} FROM rounds WHERE round = ?", (t,)).fetchone()
        if row is None:
            raise KeyError(
                f"round {t} not in history (completed: 1..{self.last_completed_round()})"
            )
        return row

    def participants(self, t: int) -> list[int]:
        """Clients C[t] that took part in round t."""
        return json.loads(self._row(t, "participants")[0])

    def data_sizes(self, t: int) -> dict[int, int]:
        """M_n of the participants of round t."""
        return {int(k): v for k, v in json.loads(self._row(t, "data_sizes")[0]).items()}

    def metrics(self, t: int) -> dict[str, Any]:
        """Metrics recorded for round t (test accuracy and loss, ...)."""
        return json.loads(self._row(t, "metrics")[0])

    def round_info(self, t: int) -> dict[str, Any]:
        """Everything about round t except tensors."""
        cols = "participants, data_sizes, metrics, wall_s, link_s, cum_link_s, bytes, updates_kept"
        p, d, m, w, ls, cls, b, kept = self._row(t, cols)
        return {
            "round": t,
            "participants": json.loads(p),
            "data_sizes": {int(k): v for k, v in json.loads(d).items()},
            "metrics": json.loads(m),
            "wall_s": w,
            "link_s": ls,
            "cum_link_s": cls,
            "bytes": b,
            "updates_kept": bool(kept),
        }

    def client_rounds(self, n: int) -> list[int]:
        """Rounds in which client n took part."""
        return [t for t in self.rounds() if n in self.participants(t)]

    def has_updates(self, t: int) -> bool:
        """Whether round t's client updates are still stored (see ``keep_rounds``)."""
        return bool(self._row(t, "updates_kept")[0])

    def client_updates(self, t: int) -> dict[int, dict[str, torch.Tensor]]:
        """All participants' updates Theta_{n,E}[t] - Theta[t] of round t (float32)."""
        if not self.has_updates(t):
            raise KeyError(
                f"client updates of round {t} were dropped (keep_rounds={self.keep_rounds})"
            )
        flat = self._load(f"updates_{t:05d}")
        out: dict[int, dict[str, torch.Tensor]] = {n: {} for n in self.participants(t)}
        for key, v in flat.items():
            n, name = key.split("/", 1)
            out[int(n)][name] = v.float()
        return out

    def client_update(self, t: int, n: int) -> dict[str, torch.Tensor]:
        """Update Theta_{n,E}[t] - Theta[t] of client n in round t (float32)."""
        if n not in self.participants(t):
            raise KeyError(f"client {n} did not take part in round {t}")
        if not self.has_updates(t):
            raise KeyError(
                f"client updates of round {t} were dropped (keep_rounds={self.keep_rounds})"
            )
        return {k: v.float() for k, v in self._load(f"updates_{t:05d}", f"{n}/").items()}

    def client_model(self, t: int, n: int) -> dict[str, torch.Tensor]:
        """Local model Theta_{n,E}[t] = Theta[t] + update (integer buffers from Theta[t])."""
        state = self.global_model(t)
        for k, v in self.client_update(t, n).items():
            state[k] = state[k] + v
        return state

    def global_model(self, t: int) -> dict[str, torch.Tensor]:
        """Theta[t], the global model at the start of round t (t = last + 1: the final one)."""
        name = f"global_{t:05d}"
        if not 1 <= t <= self.last_completed_round() + 1 or self._file_row(name) is None:
            raise KeyError(f"no global model for round {t}")
        return self._load(name)

    def final_model(self) -> dict[str, torch.Tensor]:
        """The global model after the last completed round."""
        return self.global_model(self.last_completed_round() + 1)

    def link_seconds(self, t: int) -> float:
        """Simulated link seconds of round t alone (0: the initial broadcast)."""
        if t == 0:
            return float(self._meta()["initial_link_s"] or 0.0)
        return float(self._row(t, "link_s")[0])

    def cumulative_link_seconds(self, t: int | None = None) -> float:
        """Simulated link clock at the end of round t (default: the last completed round)."""
        t = self.last_completed_round() if t is None else t
        initial = float(self._meta()["initial_link_s"] or 0.0)
        if t == 0:
            return initial
        return float(self._row(t, "cum_link_s")[0])

    def group_changes(self, t: int) -> dict[tuple[str, int], float]:
        """Max abs change of every parameter group (layer, j) in round t."""
        rows = self._db.execute(
            "SELECT layer, grp, max_abs FROM group_change WHERE round = ?", (t,)
        ).fetchall()
        return {(layer, int(j)): float(m) for layer, j, m in rows}

    def group_last_update(
        self, as_of: int | None = None, tol: float | None = None
    ) -> dict[tuple[str, int], tuple[int, float]]:
        """Per group (layer, j): (round, link seconds) of its last update up to round ``as_of``.

        Groups never updated report round 0 and the end of the initial broadcast.
        """
        as_of = self.last_completed_round() if as_of is None else as_of
        tol = self.update_tol if tol is None else tol
        initial = self.cumulative_link_seconds(0)
        out = {(layer, j): (0, initial) for layer, g in self.groups.items() for j in range(len(g))}
        rows = self._db.execute(
            "SELECT g.layer, g.grp, MAX(g.round) FROM group_change g "
            "WHERE g.round <= ? AND g.max_abs > ? GROUP BY g.layer, g.grp",
            (as_of, tol),
        ).fetchall()
        for layer, j, r in rows:
            out[(layer, int(j))] = (int(r), self.cumulative_link_seconds(int(r)))
        return out

    # -- erasure ---------------------------------------------------------------------------

    def erase_clients(self, clients: Iterable[int], reason: str = "") -> dict[str, Any]:
        """Delete every stored update of ``clients``; they leave their rounds' participants.

        Each round file holding an update of a client is written again without it; the client
        is removed from the round's ``participants`` and ``data_sizes``, so aggregation weights
        of later unlearning requests no longer count its data. The whole erasure is one commit
        (a crash leaves it done or not done), after which the old files are removed.
        Idempotent: erasing a client twice erases nothing the second time. Returns
        ``{"clients", "rounds", "updates", "bytes", "erased_updates", "derived_kept_rounds",
        "reason", "version"}``: the rounds touched, the number of client updates deleted, the
        tensor bytes deleted, per (round, client) the SHA-256 of the stored update deleted
        (:func:`~scaleflu.fl.integrity.state_sha256` of its tensors as stored; None where
        retention had dropped it already), the rounds from the clients' first participation on
        whose global models and other clients' updates remain (computed after the clients'
        updates were averaged in), and the store's version after the erasure.
        """
        clients = sorted({int(n) for n in clients})
        now = time.time()
        touched: list[int] = []
        rows: list[tuple[Any, ...]] = []  # erased table rows
        changes: list[tuple[Any, ...]] = []  # rounds table updates
        hashes: list[dict[str, Any]] = []
        n_bytes = 0
        first: int | None = None
        for t in self.rounds():
            part = self.participants(t)
            hit = [n for n in clients if n in part]
            if not hit:
                continue
            first = t if first is None else first
            sizes = self.data_sizes(t)
            per: dict[int, int] = {n: 0 for n in hit}
            mine: dict[int, dict[str, torch.Tensor]] = {n: {} for n in hit}
            kept = self.has_updates(t)
            if kept:
                flat = self._load(f"updates_{t:05d}")
                keep = {}
                for key, v in flat.items():
                    n_str, name = key.split("/", 1)
                    n = int(n_str)
                    if n in per:
                        per[n] += v.numel() * v.element_size()
                        mine[n][name] = v
                    else:
                        keep[key] = v
                if keep:
                    self._save(keep, f"updates_{t:05d}")
                else:
                    self._delete(f"updates_{t:05d}")
            for n in hit:
                sha = state_sha256(mine[n]) if kept and mine[n] else None
                hashes.append({"round": t, "client": n, "sha256": sha, "bytes": per[n]})
            n_bytes += sum(per.values())
            rows += [(t, n, int(sizes.get(n, 0)), per[n], reason, now) for n in hit]
            rest = [n for n in part if n not in hit]
            rest_sizes = {str(n): int(sizes[n]) for n in rest}
            changes.append((json.dumps(rest), json.dumps(rest_sizes), 1 if kept and rest else 0, t))
            touched.append(t)
        if touched:
            note = {"clients": clients, "reason": reason, "at": now}
            with self._tx(erasure=note):
                self._db.executemany(
                    "UPDATE rounds SET participants = ?, data_sizes = ?, updates_kept = ? "
                    "WHERE round = ?",
                    changes,
                )
                self._db.executemany(
                    "INSERT OR REPLACE INTO erased VALUES (?, ?, ?, ?, ?, ?)", rows
                )
            log.info(
                "history: erased %d stored updates of client(s) %s in %d rounds (%d bytes)",
                len(rows),
                clients,
                len(touched),
                n_bytes,
            )
        last = self.last_completed_round()
        derived = list(range(first, last + 1)) if first is not None else []
        return {
            "clients": clients,
            "rounds": touched,
            "updates": len(rows),
            "bytes": n_bytes,
            "erased_updates": hashes,
            "derived_kept_rounds": derived,
            "reason": reason,
            "version": self.version,
        }

    def erased(self) -> list[dict[str, Any]]:
        """The erasure log: one row per (round, client) whose stored update was deleted."""
        rows = self._db.execute(
            "SELECT round, client, data_size, bytes, reason, erased_at FROM erased "
            "ORDER BY round, client"
        ).fetchall()
        cols = ("round", "client", "data_size", "bytes", "reason", "erased_at")
        return [dict(zip(cols, r, strict=True)) for r in rows]

    def erased_clients(self) -> set[int]:
        """Clients with at least one erased update."""
        return {int(n) for (n,) in self._db.execute("SELECT DISTINCT client FROM erased")}

    def replace_final(self, state: Mapping[str, torch.Tensor]) -> None:
        """Overwrite the final global model Theta[T+1] (e.g. with the unlearned Theta')."""
        self._save(
            {k: v.float() if v.is_floating_point() else v for k, v in state.items()},
            f"global_{self.last_completed_round() + 1:05d}",
        )
        with self._tx():
            pass

    # -- receipts ----------------------------------------------------------------------------

    def append_receipt(self, body: str, sha256: str | None = None) -> int:
        """Keep an erasure receipt (its JSON text) in the store; its sequence number.

        ``sha256``: the receipt's name in the chain (default: of ``body``); each receipt names
        its predecessor's (:meth:`last_receipt_sha256`). The receipts table is inside the
        metadata digest, so the store's integrity covers every receipt its server issued.
        """
        sha = sha256 or hashlib.sha256(body.encode()).hexdigest()
        with self._tx():
            (seq,) = self._db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM receipts").fetchone()
            self._db.execute(
                "INSERT INTO receipts VALUES (?, ?, ?, ?)", (int(seq), self.version + 1, sha, body)
            )
        return int(seq)

    def receipts(self) -> list[dict[str, Any]]:
        """The receipts kept, oldest first: ``{"seq", "version", "sha256", "body"}``."""
        rows = self._db.execute("SELECT seq, version, sha256, body FROM receipts ORDER BY seq")
        return [dict(zip(("seq", "version", "sha256", "body"), r, strict=True)) for r in rows]

    def last_receipt_sha256(self) -> str | None:
        """SHA-256 of the last receipt kept (each receipt names its predecessor's), or None."""
        row = self._db.execute("SELECT sha256 FROM receipts ORDER BY seq DESC LIMIT 1").fetchone()
        return str(row[0]) if row is not None else None

    def storage_bytes(self) -> dict[str, int]:
        """Bytes on disk: ``globals``, ``updates``, ``sqlite`` and ``total``."""
        glob = sum(p.stat().st_size for p in self.dir.glob("global_*.safetensors"))
        upd = sum(p.stat().st_size for p in self.dir.glob("updates_*.safetensors"))
        db = sum(p.stat().st_size for p in self.dir.glob("history.sqlite*"))
        return {"globals": glob, "updates": upd, "sqlite": db, "total": glob + upd + db}
