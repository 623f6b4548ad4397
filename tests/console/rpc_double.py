"""A local Ethereum JSON-RPC double: real-shaped transaction receipts and ERC-20 Transfer
logs, served over HTTP from a thread of the test process. Never a real chain. A test may
make it hostile: `Chain.hostile` answers a method with any JSON body instead."""

from __future__ import annotations

import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TRANSFER_TOPIC = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"


def address() -> str:
    return "0x" + secrets.token_hex(20)


def _topic(addr: str) -> str:
    return "0x" + "0" * 24 + addr[2:].lower()


class Chain:
    def __init__(self, chain_id: int = 8453) -> None:
        self.chain_id = chain_id
        self.head = 1000
        self.receipts: dict[str, dict] = {}
        self.calls: list[str] = []
        # method -> the whole answer to send instead of the real one (any JSON value but null)
        self.hostile: dict[str, object] = {}

    def transfer(
        self,
        token: str,
        sender: str,
        to: str,
        units: int,
        *,
        block: int,
        status: str = "0x1",
        data: str | None = None,
    ) -> str:
        """Mine a transaction holding one Transfer log of `units` (or of the raw `data` a
        hostile node would put there); returns its hash."""
        tx_hash = "0x" + secrets.token_hex(32)
        self.receipts[tx_hash] = {
            "transactionHash": tx_hash,
            "blockNumber": hex(block),
            "blockHash": "0x" + secrets.token_hex(32),
            "status": status,
            "from": sender,
            "to": token,
            "gasUsed": "0xb4f2",
            "logs": [
                {
                    "address": token,
                    "topics": [TRANSFER_TOPIC, _topic(sender), _topic(to)],
                    "data": data if data is not None else "0x" + f"{units:064x}",
                    "blockNumber": hex(block),
                    "transactionHash": tx_hash,
                    "logIndex": "0x0",
                    "removed": False,
                }
            ],
        }
        return tx_hash

    def answer(self, method: str, params: list):
        self.calls.append(method)
        if method == "eth_chainId":
            return hex(self.chain_id)
        if method == "eth_blockNumber":
            return hex(self.head)
        if method == "eth_getTransactionReceipt":
            return self.receipts.get(params[0])  # None: unknown or not mined yet
        raise KeyError(method)


class RpcDouble:
    def __init__(self, chain: Chain) -> None:
        self.chain = chain
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                request = json.loads(self.rfile.read(int(self.headers["content-length"])))
                body = double.chain.hostile.get(request["method"])
                if body is None:
                    body = double.answer(request)
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, request: dict) -> dict:
        try:
            result = self.chain.answer(request["method"], request["params"])
        except KeyError:
            error = {"code": -32601, "message": "method not found"}
            return {"jsonrpc": "2.0", "id": request["id"], "error": error}
        return {"jsonrpc": "2.0", "id": request["id"], "result": result}

    def __enter__(self) -> RpcDouble:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
