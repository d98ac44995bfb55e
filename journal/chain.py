"""Verify a run's hash chain: every row's prev_hash is the previous row's hash, every hash matches the row's
content, and seqs run 1, 2, 3 ... without a gap. Names the first seq that does not hold."""

# The chain alone cannot see rows cut off its end (what is left still chains), nor a journal rewritten with
# fresh hashes (anyone can compute sha256). The first needs a head recorded elsewhere, compared here: the run
# row records it when the run ends (runs.models.Run.journal_head_seq / journal_head_hash). The second needs a
# head that someone outside the database holds: a signed receipt (runs.receipts).

from dataclasses import dataclass
from uuid import UUID

from .models import JournalEvent
from .services import GENESIS, row_hash


@dataclass
class ChainReport:
    ok: bool
    count: int
    head_seq: int
    head_hash: str
    first_bad_seq: int | None = None
    reason: str = ""


def chain_verify(*, run_id: UUID | str, expect_head: tuple[int, str] | None = None, exact: bool = True) -> ChainReport:
    """expect_head: (seq, hash) recorded elsewhere (the run row, a receipt): the chain must reach that row with
    that hash, which catches rows cut off the end. exact (the run has ended, nothing may follow its head): the
    chain must also end there, which catches rows forged after it; exact=False accepts rows after the recorded
    head (a receipt taken while the run was still going, or a failed run that was retried since)."""
    prev, expected_seq, count = GENESIS, 1, 0
    rows = (
        JournalEvent.objects.filter(run_id=run_id)
        .order_by("seq")
        .values_list(
            "seq", "kind", "step_id", "attempt", "payload", "created_at", "writer", "epoch", "prev_hash", "hash"
        )
    )
    head_seq, head_hash = 0, GENESIS
    expect_seq = expect_head[0] if expect_head is not None else None
    hash_at_expected = GENESIS if expect_seq == 0 else None
    for seq, kind, step_id, attempt, payload, created_at, writer, epoch, prev_hash, digest in rows.iterator():
        count += 1
        if seq != expected_seq:
            bad = min(seq, expected_seq)
            return ChainReport(
                False,
                count,
                head_seq,
                head_hash,
                bad,
                f"seq {expected_seq} is missing (the next row is seq {seq})"
                if seq > expected_seq
                else f"seq {seq} appears out of order",
            )
        if prev_hash != prev:
            return ChainReport(
                False, count, head_seq, head_hash, seq, f"seq {seq} does not follow seq {seq - 1} (prev_hash differs)"
            )
        recomputed = row_hash(
            prev_hash=prev,
            run_id=run_id,
            seq=seq,
            kind=kind,
            step_id=step_id,
            attempt=attempt,
            payload=payload,
            created_at=created_at,
            writer=writer,
            epoch=epoch,
        )
        if recomputed != digest:
            return ChainReport(
                False, count, head_seq, head_hash, seq, f"seq {seq} was changed (its hash does not match)"
            )
        prev, expected_seq, head_seq, head_hash = digest, expected_seq + 1, seq, digest
        if seq == expect_seq:
            hash_at_expected = digest
    if expect_head is not None:
        seq, digest = expect_head
        if head_seq < seq:
            return ChainReport(
                False,
                count,
                head_seq,
                head_hash,
                head_seq + 1,
                f"seq {head_seq + 1} is missing: the journal ends at seq {head_seq} but its recorded head is seq {seq}",
            )
        if hash_at_expected != digest:
            return ChainReport(
                False,
                count,
                head_seq,
                head_hash,
                seq,
                f"seq {seq} is not the recorded head (another hash: the journal was rewritten up to seq {seq})",
            )
        if exact and head_seq > seq:
            return ChainReport(
                False,
                count,
                head_seq,
                head_hash,
                seq + 1,
                f"seq {seq + 1} follows the recorded head (seq {seq}) of a run that has ended",
            )
    return ChainReport(True, count, head_seq, head_hash)
