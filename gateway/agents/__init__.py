"""Hosted agents: agents of a project, and runs that loop model call -> sandbox tool ->
model call under a budget, in the background, independent of HTTP.

`run_engine.AgentEngine` is the entry point (`gateway.agents` on a started `Gateway`);
each step goes through the same endpoints, pricing, holds and receipts as the same call
on /v1 (`run_step`), and the run's own budget is enforced by storage in the statements
that move the money (storage/migrations/sqlite/0007_agents.sql).

For the console (decisions.md, "Hosted agents"), with `engine = gateway.agents`:
- POST .../projects/{id}/agents: `decode_agent_request(body)`, then
  `engine.create_agent(project_id, **msgspec.structs.asdict(request))` -> AgentRecord;
- GET .../projects/{id}/agents: `engine.list_agents(project_id)`;
- POST .../agents/{id}/runs: `engine.get_agent(id)`, `decode_run_request(body)`, then
  `engine.start_run(agent, input=request.input, budget=request.budget_micros)`;
- GET .../runs/{run_id}: `engine.get_run(id)`, `engine.run_steps(id)`, `run_view(...)`;
- GET .../runs/{run_id}/events: `async for event in engine.events(id)`: `event.sse()`;
- POST .../runs/{run_id}/cancel: `engine.cancel(id)` (StateConflict once ended).
Views (`agent_views`) render amounts as decimal strings; errors are GatewayErrors.
"""
