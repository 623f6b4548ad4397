"""Receipts in a tamper-evident log, in the style of Certificate Transparency (RFC 9162),
published in the C2SP formats (tlog-tiles, tlog-checkpoint, signed-note).

- `merkle`: tree hashing, inclusion and consistency proofs (RFC 9162 section 2.1).
- `tiles`: the tree as 256-hash tiles: the right edge kept in memory, proofs from tiles.
- `log_key`: the deployment's Ed25519 key and its key id.
- `receipts`: the canonical public receipt, signed tree heads and the proof document.
- `checkpoint`: the signed tree head as a C2SP checkpoint (signed note) and its vkey.
- `log`: the integrator: receipts into tiles, proofs and entry bundles from storage.
- `verify`: offline verification of a proof document, used by `gateway verify`.
"""
