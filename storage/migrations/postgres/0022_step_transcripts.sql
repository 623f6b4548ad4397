-- What each agent step did, kept for the run's page (decisions.md, Operators (wave 3)):
-- a model step's new messages and the model's reply, a sandbox step's code, stdout,
-- stderr, exit code and status, each text cut at 64 KiB (gateway/agents/transcript.py).
-- JSON text, as the table's `error`, not jsonb: jsonb refuses the escape \u0000, and a
-- program's output may hold that character. NULL for the steps recorded before this
-- migration (and for a step a sweeper closed before its process could describe it).
ALTER TABLE agent_steps ADD COLUMN transcript TEXT;
