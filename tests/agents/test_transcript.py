"""The transcript a step keeps (gateway/agents/transcript.py): the messages new at a model
step, the reply, a sandbox step's program and output, every text bounded."""

from __future__ import annotations

from model_gateway.gateway.agents.transcript import (
    MAX_ITEMS,
    TEXT_BYTES,
    model_transcript,
    sandbox_transcript,
)

CALL = {"id": "c", "type": "function", "function": {"name": "run_code", "arguments": "{}"}}


def test_a_model_step_keeps_what_was_new_since_the_last_reply():
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    answer = {
        "choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [CALL]}}]
    }
    assert model_transcript({"messages": first}, answer) == {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
        ],
        "reply": {"content": "", "tool_calls": [{"name": "run_code", "arguments": "{}"}]},
    }
    later = [
        *first,
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "42"}]},
    ]
    done = {"choices": [{"message": {"role": "assistant", "content": "42"}}]}
    assert model_transcript({"messages": later}, done) == {
        "messages": [{"role": "tool", "content": "42"}],
        "reply": {"content": "42", "tool_calls": []},
    }
    # A step the model did not answer keeps what it sent.
    assert model_transcript({"messages": first}, {}) == {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
        ]
    }


def test_every_text_is_cut_at_the_bound_never_inside_a_character():
    long = "é" * TEXT_BYTES  # two bytes each
    answer = {"choices": [{"message": {"content": long, "tool_calls": [CALL] * (MAX_ITEMS + 5)}}]}
    transcript = model_transcript({"messages": [{"role": "user", "content": long}]}, answer)
    (message,) = transcript["messages"]
    assert message["truncated"] and message["content"] == "é" * (TEXT_BYTES // 2)
    reply = transcript["reply"]
    assert reply["truncated"] and len(reply["content"].encode()) == TEXT_BYTES
    assert reply["tool_calls_truncated"] and len(reply["tool_calls"]) == MAX_ITEMS
    ran = {"stdout": "x" * (TEXT_BYTES + 1), "stderr": "", "exit_code": 0, "status": "completed"}
    out = sandbox_transcript({"runtime": "python", "code": "€" * TEXT_BYTES}, ran)
    assert out["code_truncated"] and out["code"] == "€" * (TEXT_BYTES // 3)
    assert out["stdout_truncated"] and out["stdout"] == "x" * TEXT_BYTES
    assert "stderr_truncated" not in out


def test_a_sandbox_step_keeps_its_program_and_only_the_outputs_named():
    answer = {
        "id": "exec_1",
        "sandbox_id": "sbx_1",
        "runtime": "python",
        "status": "timed_out",
        "exit_code": -9,
        "stdout": "partial",
        "stderr": "",
        "stdout_truncated": True,  # the node kept only its first 64 KiB
        "stderr_truncated": False,
        "receipt_id": "rcpt_1",
    }
    request = {"sandbox_id": "sbx_1", "runtime": "python", "code": "while True: pass"}
    assert sandbox_transcript(request, answer) == {
        "runtime": "python",
        "code": "while True: pass",
        "stdout": "partial",
        "stdout_truncated": True,
        "stderr": "",
        "exit_code": -9,
        "status": "timed_out",
    }
    # Cancelled or failed before the node answered: the program, no output.
    assert sandbox_transcript(request, {}) == {"runtime": "python", "code": "while True: pass"}
