"""Receipt ids: time first, so they grow with time (a storage index appends them), then
64 random bits, so they cannot be guessed; the form the storages pack (lowercase hex)."""

from __future__ import annotations

import re
import time

from model_gateway.pipeline.reservation import new_receipt_id


def test_receipt_ids_grow_with_time_and_stay_unique():
    ids = []
    for _ in range(5):
        ids += [new_receipt_id() for _ in range(200)]
        time.sleep(0.002)
    assert len(set(ids)) == len(ids)
    # Within a millisecond the random part orders them; across milliseconds time does.
    assert [i[:17] for i in ids] == sorted(i[:17] for i in ids)
    assert ids[0][:17] < ids[-1][:17]
    for receipt_id in ids:
        assert re.fullmatch(r"rcpt_[0-9a-f]{28}", receipt_id)


def test_the_time_part_is_the_issue_millisecond():
    before = time.time_ns() // 1_000_000
    receipt_id = new_receipt_id()
    after = time.time_ns() // 1_000_000
    assert before <= int(receipt_id[5:17], 16) <= after
