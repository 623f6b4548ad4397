"""The public proof page, GET /proofs/{receipt_id}: server-rendered HTML, no assets, no script.

Every value is escaped where it is written. The one stylesheet is inline and allowed by its
hash in the Content-Security-Policy, which otherwise allows nothing: no scripts, images,
fonts, frames, forms or connections.
"""

from __future__ import annotations

import base64
import hashlib
from html import escape

from model_gateway.gateway.proofs.links import is_absolute
from model_gateway.gateway.proofs.receipts import (
    AnyPublicReceipt,
    ProofDocument,
    PublicReceiptV1,
    PublicReceiptV3,
)
from model_gateway.gateway.proofs.verify import VerifyResult

_STYLE = """
body{font:15px/1.5 system-ui,sans-serif;max-width:46rem;margin:2rem auto;padding:0 1rem;
color:#1b1b1b}
h1{font-size:1.4rem;margin-bottom:.2rem}h2{font-size:1.1rem;margin-top:2rem}
.id{font-family:ui-monospace,monospace;color:#555}
.verdict{padding:.8rem 1rem;border-radius:6px;margin:1.2rem 0;font-weight:600}
.ok{background:#e6f4ea;color:#14532d}.bad{background:#fdecea;color:#7f1d1d}
.wait{background:#fff7e0;color:#5c4400}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:.3rem .5rem;
border-bottom:1px solid #e5e5e5;vertical-align:top}th{width:11rem;font-weight:500;color:#444}
code,.hash{font-family:ui-monospace,monospace;font-size:.85rem;word-break:break-all}
pre{background:#f5f5f5;padding:.7rem;border-radius:6px;overflow-x:auto}
.note{color:#555;font-size:.9rem}
"""

_STYLE_HASH = base64.b64encode(hashlib.sha256(_STYLE.encode()).digest()).decode()

CONTENT_SECURITY_POLICY = (
    f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)

PAGE_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
}


def _page(title: str, body: str, *, refresh: bool = False) -> str:
    # A meta refresh is not a script: the CSP still allows none.
    meta = '<meta http-equiv="refresh" content="1">' if refresh else ""
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="referrer" content="no-referrer">{meta}'
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body>{body}</body></html>\n"
    )


def _rows(rows: list[tuple[str, str]]) -> str:
    # Values arrive already escaped (some carry markup); names are ours.
    return (
        "<table>"
        + "".join(f"<tr><th>{name}</th><td>{value}</td></tr>" for name, value in rows)
        + "</table>"
    )


def _hash(value: str) -> str:
    return f'<span class="hash">{escape(value)}</span>'


def _verdict(doc: ProofDocument[AnyPublicReceipt], result: VerifyResult) -> str:
    if result.ok:
        return (
            '<div class="verdict ok">Verified: signed by this deployment\'s key and included '
            f"in its transparency log (entry {doc.leaf_index + 1} of {doc.tree_head.size}).</div>"
        )
    reasons = "".join(f"<li>{escape(r)}</li>" for r in result.reasons)
    return f'<div class="verdict bad">Verification failed:<ul>{reasons}</ul></div>'


def _billed(receipt: AnyPublicReceipt) -> str:
    subject = "Model" if receipt.kind == "inference" else "Runtime"
    usage = ", ".join(f"{escape(k)}: {v}" for k, v in sorted(receipt.usage.items())) or "none"
    rows = [
        ("Cost", f"{escape(receipt.cost)} USD"),
        ("Issued at", f"{escape(receipt.issued_at)} (UTC)"),
        ("Status", escape(receipt.status)),
        ("Kind", escape(receipt.kind)),
        ("Endpoint", f"<code>{escape(receipt.endpoint)}</code>"),
        (subject, escape(receipt.model_or_runtime)),
        ("Usage", usage),
    ]
    if not isinstance(receipt, PublicReceiptV1):
        counted = "the provider" if receipt.usage_source == "provider" else "the gateway"
        rows.append(("Usage counted by", counted))
    if isinstance(receipt, PublicReceiptV3):
        prices = ", ".join(f"{escape(k)}: {escape(v)}" for k, v in sorted(receipt.prices.items()))
        rows.append(("Prices applied (USD per million tokens)", prices))
    return _rows(rows)


def _bodies(receipt: AnyPublicReceipt) -> str:
    """What the receipt publishes about the request and response bodies, by version."""
    if isinstance(receipt, PublicReceiptV1):
        rows = _rows(
            [
                ("Request SHA-256", _hash(receipt.request_sha256)),
                ("Response SHA-256", _hash(receipt.response_sha256)),
            ]
        )
        return f"""<h2>Digests of the request and response</h2>
<p class="note">SHA-256 of the exact request and response bodies (a receipt of format
version 1). Hash your own copy to match it.</p>{rows}"""
    rows = _rows(
        [
            ("Request commitment", _hash(receipt.request_commitment)),
            ("Response commitment", _hash(receipt.response_commitment)),
        ]
    )
    return f"""<h2>Commitments to the request and response</h2>
<p class="note">The gateway publishes neither the prompt nor the output, nor a plain hash of
them. Each commitment is SHA-256 over a random 16-byte salt followed by the request body,
or by the SHA-256 of the response body. The salts are given only to the project that made
the request (on its receipt), so only it can show which bodies these are.</p>{rows}"""


def _how_to_check(doc: ProofDocument[AnyPublicReceipt], link_base: str) -> str:
    receipt_id = doc.receipt.id
    api_url = f"{link_base}/api/proofs/{receipt_id}"
    keys_url = f"{link_base}/api/proofs/keys"
    page_url = f"{link_base}/proofs/{receipt_id}"
    if is_absolute(link_base):
        target, where = escape(api_url), ""
    else:
        # No configured public address, and the Host header is never trusted: name the
        # page's address instead of spelling out one a client could have forged.
        target = "PAGE_URL"
        where = (
            '<p class="note"><code>PAGE_URL</code> is this page\'s address as your browser '
            "shows it: <code>gateway verify</code> fetches the proof document from it.</p>"
        )
    key = escape(doc.public_key)
    return f"""<h2>Check it yourself</h2>
<p>This page was verified by the server that signed it. To verify independently, with the
<code>gateway</code> command line:</p>
<pre>gateway verify {target}</pre>{where}
<p class="note">Without <code>--key</code> the command fetches the deployment's public key from
<a href="{escape(keys_url)}">{escape(keys_url)}</a> (trust on first use). For full
independence, obtain the key from the operator by another channel and pass it:</p>
<pre>gateway verify {target} --key {key}</pre>
<p class="note">The signed proof document: <a href="{escape(api_url)}">{escape(api_url)}</a>.
It holds the receipt's public fields, the RFC 9162 inclusion proof and the Ed25519-signed
tree head (also as a C2SP checkpoint). Save it and check it offline with
<code>gateway verify proof.json --key &lt;public key&gt;</code>.</p>
<p class="note">Permalink: <a href="{escape(page_url)}">{escape(page_url)}</a></p>
"""


def proof_page(
    doc: ProofDocument[AnyPublicReceipt], result: VerifyResult, *, link_base: str
) -> str:
    """`link_base`: where the gateway's paths start (gateway.proofs.links.link_base)."""
    receipt, head = doc.receipt, doc.tree_head
    rows = [
        ("Leaf index", str(doc.leaf_index)),
        ("Tree size", str(head.size)),
        ("Root hash", _hash(head.root_hash)),
        ("Tree head signed", f"{escape(head.timestamp)} (UTC)"),
        ("Signing key id", _hash(doc.key_id)),
        ("Public key", _hash(doc.public_key)),
    ]
    if doc.receipt_signature is not None:  # leaves logged before tiles only
        rows.append(("Receipt signature", _hash(doc.receipt_signature)))
    log = _rows(rows)
    body = f"""
<h1>Receipt</h1><div class="id">{escape(receipt.id)}</div>
{_verdict(doc, result)}
<h2>What was billed</h2>{_billed(receipt)}
{_bodies(receipt)}
<h2>Transparency log</h2>{log}
{_how_to_check(doc, link_base)}"""
    return _page(f"Receipt {receipt.id}", body)


def pending_page(receipt_id: str) -> str:
    body = (
        f'<h1>Receipt</h1><div class="id">{escape(receipt_id)}</div>'
        '<div class="verdict wait">This receipt is being added to the transparency log. '
        "The page reloads by itself in a second.</div>"
    )
    return _page(f"Receipt {receipt_id} (pending)", body, refresh=True)


def not_found_page(receipt_id: str) -> str:
    body = (
        f'<h1>No such receipt</h1><div class="id">{escape(receipt_id)}</div>'
        "<p>No receipt with this ID exists on this deployment. A request that was not billed "
        "has no receipt.</p>"
    )
    return _page("No such receipt", body)
