"""`gateway verify FILE_OR_URL [--key HEX | --keys-url URL] [--json]`.

Checks a proof document offline: the receipt signature, the inclusion proof and the signed
tree head. Which key is trusted decides what a valid result means, and the output says it:

- `--key HEX`: the key given (best: obtained from the operator by another channel);
- `--keys-url URL`: the key published there;
- a URL and neither option: the key the same deployment publishes at /api/proofs/keys,
  reported as fetched from the server (trust on first use);
- a file and neither option: only the key the document names itself. That shows the
  document is internally consistent, not who made it, so it is never reported as trusted.

Exit status: 0 valid, 1 invalid (the reasons are printed), 2 could not check (unreadable
document or keys, receipt still pending).
"""

from __future__ import annotations

import sys
import time
from urllib.parse import urlsplit, urlunsplit

import msgspec
import orjson

from model_gateway.gateway.proofs.verify import DocumentError, load_document, verify_proof_document

EXIT_VALID, EXIT_INVALID, EXIT_UNCHECKED = 0, 1, 2
PENDING_WAIT_S = 5.0
PENDING_POLL_S = 0.25

_KEY_SOURCES = {
    "argument": "given with --key",
    "keys_url": "published at --keys-url",
    "server": "fetched from the server (trust on first use)",
    "document": "named by the document itself (NOT trusted: pass --key or --keys-url)",
}


class _Unchecked(Exception):
    pass


def add_parser(commands, common) -> None:
    p = commands.add_parser(
        "verify",
        parents=[common],
        help="check a receipt proof offline: signature, log inclusion and tree head",
    )
    p.add_argument("file_or_url", metavar="FILE_OR_URL", help="a proof document or its URL")
    trust = p.add_mutually_exclusive_group()
    trust.add_argument("--key", help="the deployment's Ed25519 public key, 64 hex characters")
    trust.add_argument("--keys-url", help="where the deployment publishes its public keys")
    p.set_defaults(standalone=run)


def keys_url_for(proof_url: str) -> str:
    """The /api/proofs/keys of the deployment that serves this proof or proof page URL."""
    parts = urlsplit(proof_url)
    path = parts.path
    # Keep a mount prefix: https://host/gw/api/proofs/rcpt_1 -> https://host/gw/api/proofs/keys
    for marker in ("/api/proofs/", "/proofs/"):
        at = path.rfind(marker)
        if at >= 0:
            path = path[:at]
            break
    else:
        path = ""
    return urlunsplit((parts.scheme, parts.netloc, path + "/api/proofs/keys", "", ""))


def _is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


def _load_proof(target: str) -> dict:
    deadline = time.monotonic() + PENDING_WAIT_S
    while True:
        try:
            doc = load_document(target)
        except DocumentError as exc:
            raise _Unchecked(str(exc)) from None
        if doc.get("status") != "pending":
            return doc
        # Just settled: the log integrates receipts within a second.
        if not _is_url(target) or time.monotonic() >= deadline:
            raise _Unchecked(
                f"receipt {doc.get('receipt_id', '')} is not in the transparency log yet"
                " (pending); retry in a second"
            )
        time.sleep(PENDING_POLL_S)


def _published_key(keys_url: str, key_id: object) -> bytes:
    try:
        listing = load_document(keys_url)
    except DocumentError as exc:
        raise _Unchecked(f"cannot fetch the deployment's keys: {exc}") from None
    keys = listing.get("data")
    if not isinstance(keys, list) or not keys:
        raise _Unchecked(f"{keys_url} does not list any public key")
    # The key the document names, if the deployment publishes it; else the current one,
    # so that verification fails and says the document is signed by another key.
    chosen = next((k for k in keys if isinstance(k, dict) and k.get("key_id") == key_id), keys[0])
    try:
        public_key = bytes.fromhex(chosen["public_key"])
    except (TypeError, KeyError, ValueError):
        raise _Unchecked(f"{keys_url} lists a malformed public key") from None
    if len(public_key) != 32:
        raise _Unchecked(f"{keys_url} lists a malformed public key")
    return public_key


def _check(args) -> dict:
    source, keys_url, trusted = "document", None, None
    if args.key is not None:
        try:
            trusted = bytes.fromhex(args.key)
        except ValueError:
            trusted = b""
        if len(trusted) != 32:
            raise _Unchecked("--key must be an Ed25519 public key: 64 hex characters")
        source = "argument"
    doc = _load_proof(args.file_or_url)
    if args.keys_url is not None:
        source, keys_url = "keys_url", args.keys_url
    elif args.key is None and _is_url(args.file_or_url):
        source, keys_url = "server", keys_url_for(args.file_or_url)
    if keys_url is not None:
        trusted = _published_key(keys_url, doc.get("key_id"))
    result = verify_proof_document(doc, trusted)
    report = msgspec.to_builtins(result)
    report["checked"] = True
    report["key_source"] = source
    report["key_source_detail"] = _KEY_SOURCES[source]
    report["keys_url"] = keys_url
    if result.ok:
        report["issued_at"] = doc["receipt"]["issued_at"]
        report["cost"] = doc["receipt"]["cost"]
        report["status"] = doc["receipt"]["status"]
    return report


def _print_text(report: dict) -> None:
    if report["ok"]:
        print(
            f"OK: receipt {report['receipt_id']} ({report['status']}, cost {report['cost']} USD,"
            f" issued {report['issued_at']}) is signed by key {report['key_id']} and included"
            f" at leaf {report['leaf_index']} of the log of size {report['tree_size']}"
            f" (root {report['root_hash']})."
        )
    else:
        print(f"FAILED: receipt proof {report.get('receipt_id') or ''} does not verify:")
        for reason in report["reasons"]:
            print(f"  - {reason}")
    detail = report["key_source_detail"]
    if report["keys_url"]:
        detail += f": {report['keys_url']}"
    print(f"key: {detail}")
    if report["key_source"] == "server" and report["ok"]:
        print(
            "  A key fetched from the server that serves the proof shows that this deployment"
            " signed it; compare the key id with one you obtained independently, or pass --key."
        )


def run(args) -> int:
    try:
        report = _check(args)
    except _Unchecked as exc:
        if args.json:
            sys.stdout.write(
                orjson.dumps({"ok": False, "checked": False, "reasons": [str(exc)]}).decode() + "\n"
            )
        print(f"gateway verify: {exc}", file=sys.stderr)
        return EXIT_UNCHECKED
    if args.json:
        sys.stdout.write(orjson.dumps(report).decode() + "\n")
    else:
        _print_text(report)
    return EXIT_VALID if report["ok"] else EXIT_INVALID
