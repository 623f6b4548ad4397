"""Signed receipts in a tamper-evident log, in the style of Certificate Transparency (RFC 9162).

- `merkle`: tree hashing, inclusion and consistency proofs (RFC 9162 section 2.1).
- `signing`: the deployment's Ed25519 key and its key id.
- `receipts`: the canonical public receipt, signed tree heads and the proof document.
- `verify`: offline verification of a proof document, used by `gateway verify`.
"""
