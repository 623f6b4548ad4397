"""Onchain purchases: is this transaction a confirmed transfer of our token to our
treasury from one of the project's payer addresses, and what is it worth?

Read over JSON-RPC (`eth_getTransactionReceipt`, `eth_blockNumber`) from the node in
`[purchases] rpc_url`. Money stays exact: token units are integers, `usd_per_token` a
decimal, the credit rounded down to micro-units. The node is not trusted to be well-formed:
any answer of the wrong shape (a JSON number where hex is due, a negative, a credit past
64 bits) is a 503 with nothing credited, never a crash or another refusal's message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING

import aiohttp
import orjson

from model_gateway.gateway.config import PurchasesConfig
from model_gateway.pipeline.errors import Forbidden, InvalidRequest, ServiceUnavailable
from model_gateway.storage.base import MAX_AMOUNT

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject

# keccak256("Transfer(address,address,uint256)"): the topic of every ERC-20 transfer log.
TRANSFER_TOPIC = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"
TX_HASH = re.compile(r"0x[0-9a-f]{64}")
ADDRESS = re.compile(r"0x[0-9a-f]{40}")
# JSON-RPC's QUANTITY and DATA as hex strings. Python's int(x, 16) alone would also take a
# sign, "_" and spaces, and a JSON number would fail it with TypeError.
HEX_NUMBER = re.compile(r"0x[0-9a-fA-F]+")
RETRY_S = 15  # a pending purchase: ask again after this


@dataclass(frozen=True, slots=True)
class Transfer:
    sender: str
    token_units: int
    amount: int  # micro-units


class AwaitingConfirmations(Exception):
    """Mined too recently (or not yet): not enough confirmations."""

    def __init__(self, confirmations: int, needed: int) -> None:
        super().__init__(f"{confirmations} of {needed} confirmations")
        self.confirmations, self.needed = confirmations, needed


def tx_hash_of(text: object) -> str:
    value = text.strip().lower() if isinstance(text, str) else ""
    if not TX_HASH.fullmatch(value):
        raise InvalidRequest("'tx_hash' must be 0x followed by 64 hex digits.", param="tx_hash")
    return value


def address_of(text: object, param: str) -> str:
    value = text.strip().lower() if isinstance(text, str) else ""
    if not ADDRESS.fullmatch(value):
        raise InvalidRequest("An address is 0x followed by 40 hex digits.", param=param)
    return value


def _malformed() -> ServiceUnavailable:
    return ServiceUnavailable("The chain node gave a malformed answer.", retry_after=RETRY_S)


def hex_number(value: object) -> int:
    """A node's hex-encoded number ("0x1a"), never negative; anything else is malformed."""
    if not isinstance(value, str) or not HEX_NUMBER.fullmatch(value):
        raise _malformed()
    return int(value, 16)


def _topic_address(topic: str) -> str:
    return "0x" + topic[-40:].lower()


def credit_of(token_units: int, config: PurchasesConfig) -> int:
    """Token units times usd_per_token, in micro-units, rounded down."""
    usd = Fraction(token_units, 10**config.token_decimals) * Fraction(Decimal(config.usd_per_token))
    return int(usd * 1_000_000)  # int() of a non-negative Fraction rounds down


def transfer_of(
    receipt: JSONObject, head: int, payers: list[str], config: PurchasesConfig
) -> Transfer:
    """The confirmed transfer a transaction receipt proves, or the reason it does not."""
    if receipt.get("status") != "0x1":
        raise InvalidRequest("The transaction failed onchain (reverted): nothing to credit.")
    token, treasury = config.token_address.lower(), config.treasury_address.lower()
    transfers = [
        log
        for log in receipt.get("logs") or []
        if str(log.get("address", "")).lower() == token
        and len(log.get("topics") or []) == 3
        and log["topics"][0].lower() == TRANSFER_TOPIC
        and _topic_address(log["topics"][2]) == treasury
    ]
    if not transfers:
        raise InvalidRequest(
            "The transaction holds no transfer of the accepted token to the treasury."
        )
    senders = {_topic_address(log["topics"][1]) for log in transfers}
    if not senders <= set(payers):
        raise Forbidden("The transfer was sent from an address this project has not registered.")
    confirmations = head - hex_number(receipt["blockNumber"]) + 1
    if confirmations < config.confirmations:
        raise AwaitingConfirmations(max(confirmations, 0), config.confirmations)
    units = sum(hex_number(log["data"]) for log in transfers)
    amount = credit_of(units, config)
    if amount > MAX_AMOUNT:  # a uint256 may hold it; no balance of ours can
        raise ServiceUnavailable(
            "The transfer's value is past the largest amount the gateway can credit;"
            " nothing was credited."
        )
    return Transfer(sender=min(senders), token_units=units, amount=amount)


class ChainReader:
    """A JSON-RPC client of the operator's node. Unreachable or erring: 503 with retry-after."""

    def __init__(self, config: PurchasesConfig) -> None:
        self.config = config

    async def _call(self, session: aiohttp.ClientSession, method: str, params: list[str]) -> object:
        """The call's result: any JSON value, checked by the caller."""
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        async with session.post(
            self.config.rpc_url,
            data=orjson.dumps(body),
            headers={"content-type": "application/json"},
        ) as response:
            try:
                answer = orjson.loads(await response.read())
            except orjson.JSONDecodeError:
                raise _malformed() from None
        if not isinstance(answer, dict):
            raise _malformed()
        if "error" in answer or "result" not in answer:
            raise ServiceUnavailable("The chain node refused the query.", retry_after=RETRY_S)
        return answer["result"]

    async def transfer(self, tx_hash: str, payers: list[str]) -> Transfer:
        timeout = aiohttp.ClientTimeout(total=self.config.rpc_timeout_s)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                chain = hex_number(await self._call(session, "eth_chainId", []))
                if chain != self.config.chain_id:
                    raise ServiceUnavailable(
                        "The chain node serves another chain.", retry_after=RETRY_S
                    )
                receipt = await self._call(session, "eth_getTransactionReceipt", [tx_hash])
                if receipt is None:
                    raise AwaitingConfirmations(0, self.config.confirmations)  # not mined yet
                head = hex_number(await self._call(session, "eth_blockNumber", []))
        except (TimeoutError, aiohttp.ClientError):
            raise ServiceUnavailable(
                "The chain node cannot be reached; try again shortly.", retry_after=RETRY_S
            ) from None
        if not isinstance(receipt, dict):  # not a JSON object: no receipt (as .get failed)
            raise _malformed()
        try:
            return transfer_of(receipt, head, payers, self.config)
        except (KeyError, TypeError, ValueError, AttributeError):  # a receipt of another shape
            raise _malformed() from None
