"""Anthropic's Messages API inbound: POST /v1/messages and /v1/messages/count_tokens.

Request shapes (messages_schemas); the body an Anthropic upstream gets as it came, and the
client's anthropic-beta header (messages_upstream); the pass-through of its answers and
streams (messages_passthrough); for every other upstream, the translation to and from the
neutral chat request (messages_translate) and the stream's events (messages_stream);
usage in Anthropic's convention (messages_usage). The handlers are gateway.inference.handlers'.
"""
