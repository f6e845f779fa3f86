"""What one connection's open transactions may hold: bytes in all, and RAM in particular.

Why: nothing of a transaction is delivered before COMMIT, so a client can open
``max_transactions`` of them and leave each just under the spool's in-memory threshold; twenty
such connections held half a gigabyte of RAM that no memory limit saw. So the bytes of a
connection's open transactions are capped (``max_transaction_bytes``, an ERROR beyond it), and
once their in-memory part passes ``TX_MEMORY_PER_CONNECTION`` the largest spools move to their
temporary files.
"""

from __future__ import annotations

from collections.abc import Collection

from sluicemq.errors import ProtocolError
from sluicemq.storage.txspool import TxSpool

TX_MEMORY_PER_CONNECTION = 1 << 20


def admit(spools: Collection[TxSpool], adding: int, limit: int) -> None:
    """Refuse (ERROR, connection kept) an operation that would pass ``limit`` bytes."""
    held = sum(s.nbytes for s in spools)
    if held + adding > limit:
        raise ProtocolError(f"open transactions on this connection would hold {held + adding} "
                            f"bytes (limit {limit}, max_transaction_bytes)", fatal=False)


def bound_memory(spools: Collection[TxSpool]) -> None:
    """Spill the largest in-memory spools until the connection's RAM share fits again."""
    in_memory = sorted((s for s in spools if not s.on_disk), key=lambda s: s.nbytes,
                       reverse=True)
    total = sum(s.nbytes for s in in_memory)
    for spool in in_memory:
        if total <= TX_MEMORY_PER_CONNECTION:
            return
        spool.spill()
        total -= spool.nbytes
