"""`gateway verify FILE_OR_URL [--key HEX | --keys-url URL] [--config F] [--json]`.

Checks a proof document offline: the receipt signature, the inclusion proof and the signed
tree head, against the first key found of:

- `--key HEX`: the key given (best: obtained from the operator by another channel);
- `--keys-url URL`: the key published there (fetched, so not trusted: decisions.md trusts
  only `--key` and the deployment's own key);
- the deployment's own signing key, found through its config (`--config`,
  `GATEWAY_CONFIG`, `./config.toml`): the operator checking their own receipts;
- for a URL, the key the same server publishes at /api/proofs/keys; for a file, the key
  the document names itself. Either shows that the document is internally consistent,
  not who made it: "signature valid, key not trusted".

Exit status (decisions.md, "Hardening III"): 0 valid against a trusted key, 1 invalid (the
reasons are printed), 2 could not check (unreadable document, keys or key file, receipt
still pending), 3 valid only against a key that is not trusted. FILE_OR_URL without a
scheme but with a port (`localhost:8080/proofs/rcpt_...`) is an http URL.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import msgspec
import orjson

from model_gateway.gateway.config import ConfigError, load_config
from model_gateway.gateway.proofs.log_key import SigningKey
from model_gateway.gateway.proofs.verify import DocumentError, load_document, verify_proof_document

EXIT_VALID, EXIT_INVALID, EXIT_UNCHECKED, EXIT_UNTRUSTED = 0, 1, 2, 3
PENDING_WAIT_S = 5.0
PENDING_POLL_S = 0.25

_NOT_TRUSTED = "NOT trusted: pass --key, or run where the deployment's config is"
_KEY_SOURCES = {
    "argument": "given with --key",
    "keys_url": "published at --keys-url",
    "config": "the deployment's own signing key",
    "server": f"fetched from the server (trust on first use), {_NOT_TRUSTED}",
    "document": f"named by the document itself, {_NOT_TRUSTED}",
}
_TRUSTED_SOURCES = frozenset({"argument", "config"})
# host:port/... with no scheme: what an operator copies from a log line or a browser bar.
_HOST_AND_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}(/|\Z)")


# The CLI's parser class: its subparsers and their parents are of that class.
_Parser = TypeVar("_Parser", bound=argparse.ArgumentParser)


class _Unchecked(Exception):
    pass


def add_parser(commands: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
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


def proof_location(text: str) -> str:
    """The argument as load_document takes it: `host:port/...` is an http URL (unless a
    file of that name exists), everything else as given."""
    if not _is_url(text) and _HOST_AND_PORT.match(text) and not Path(text).exists():
        return "http://" + text
    return text


def _load_proof(target: str) -> dict[str, Any]:
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


def _deployment_key(config_path: str | None) -> tuple[bytes, str] | None:
    """The public half of the deployment's own signing key and where it was read, found
    through the config; None where there is no key file (not a deployment's folder).
    Read, never created: verifying changes nothing."""
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise _Unchecked(str(exc)) from None
    path = config.path(config.secrets.signing_key_file)
    try:
        seed = bytes.fromhex(path.read_text().strip())
        return SigningKey(seed).public_key, f"{path} ({config.source})"
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise _Unchecked(f"cannot read the deployment's signing key {path}: {exc}") from None


def _given_key(text: str) -> bytes:
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise _Unchecked("--key must be an Ed25519 public key: 64 hex characters")
    return key


def _check(args: argparse.Namespace) -> dict[str, Any]:
    given = None if args.key is None else _given_key(args.key)  # before any fetch
    target = proof_location(args.file_or_url)
    doc = _load_proof(target)
    source, keys_url, key, where = "document", None, None, ""
    if given is not None:
        source, key = "argument", given
    elif args.keys_url is not None:
        source, keys_url = "keys_url", args.keys_url
    elif (own := _deployment_key(args.config)) is not None:
        (key, where), source = own, "config"
    elif _is_url(target):
        source, keys_url = "server", keys_url_for(target)
    if keys_url is not None:
        key = _published_key(keys_url, doc.get("key_id"))
    result = verify_proof_document(doc, key)
    report: dict[str, Any] = msgspec.to_builtins(result)
    report["checked"] = True
    report["key_trusted"] = source in _TRUSTED_SOURCES
    report["key_source"] = source
    report["key_source_detail"] = _KEY_SOURCES[source] + (f": {where}" if where else "")
    report["keys_url"] = keys_url
    if result.ok:
        report["issued_at"] = doc["receipt"]["issued_at"]
        report["cost"] = doc["receipt"]["cost"]
        report["status"] = doc["receipt"]["status"]
    return report


def _print_text(report: dict[str, Any]) -> None:
    if report["ok"]:
        verdict = "OK" if report["key_trusted"] else "signature valid, key not trusted"
        print(
            f"{verdict}: receipt {report['receipt_id']} ({report['status']},"
            f" cost {report['cost']} USD, issued {report['issued_at']}) is signed by key"
            f" {report['key_id']} and included"
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
            "  A key fetched from the server that serves the proof shows only that whoever"
            " runs that server signed it; compare the key id with one you obtained"
            " independently, or pass --key."
        )


def run(args: argparse.Namespace) -> int:
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
    if not report["ok"]:
        return EXIT_INVALID
    return EXIT_VALID if report["key_trusted"] else EXIT_UNTRUSTED
