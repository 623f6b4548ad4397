"""Why an upstream attempt failed, and whether another provider may be tried for it.

A fallback is tried (and the breaker counts a failure) for what is not the client's
fault: unreachable, timeout, a 5xx, a 429, a bad response, and credentials rejected (a
401/403, or what a vendor says for it): the operator's credential for that provider was
refused, so the client gets 502 when no other provider serves, and the operator a log
line naming the provider (decisions.md, "Upstream providers"). Another 4xx is the
client's fault and ends the chain.
"""

from __future__ import annotations

from model_gateway.gateway.providers.upstream import UpstreamFailure
from model_gateway.pipeline.errors import GatewayError, InvalidRequest, ProviderTimeout

# Reasons that move on to the next provider and count against the breaker.
RETRYABLE = frozenset(
    {
        "unreachable",
        "timeout",
        "server_error",
        "rate_limited",
        "bad_response",
        "credentials_rejected",
    }
)

# What an operator reads in the log for each reason.
WORDS = {
    "unreachable": "unreachable",
    "timeout": "timed out",
    "server_error": "server error",
    "rate_limited": "rate limited",
    "bad_response": "bad response",
    "credentials_rejected": "credentials rejected",
    "client_error": "request rejected as invalid",
    "output_limit": "sent output past the request's limit",
    "error": "failed",
}


def reason_of(error: GatewayError) -> str:
    if isinstance(error, UpstreamFailure):
        return error.reason
    if isinstance(error, ProviderTimeout):
        return "timeout"
    if isinstance(error, InvalidRequest):
        return "client_error"
    return "error"
